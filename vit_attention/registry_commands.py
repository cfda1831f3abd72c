"""The registries' sub-commands: ``summary`` (build a model by name), ``models`` and ``attention`` (list them)."""

from __future__ import annotations

import argparse
import sys

import torch

from .attention import get_attention_spec, list_attention
from .factory import add_model_arg_option, create_model, merged_model_args, positive_int
from .models import list_models
from .models.registry import aliases_of, get_model_entry


def _summary(args: argparse.Namespace) -> int:
    from .analysis.commands import name_and_options

    if args.batch_size < 0:
        raise ValueError(f"--batch-size must be >= 0, got {args.batch_size}")
    name, options = name_and_options(args.model, args.model_arg)  # a run folder: the model it records
    entry = get_model_entry(name)
    img = args.img_size
    overrides = {}
    if args.num_classes is not None:
        overrides["num_classes"] = args.num_classes
    meta = args.meta or args.device == "meta"
    device = torch.device("meta" if meta else args.device)
    with device:
        model = create_model(entry.name, **merged_model_args(options, img_size=img, **overrides))
    model.eval()
    cfg = model.cfg
    size = cfg.img_size if isinstance(cfg.img_size, (tuple, list)) else (cfg.img_size, cfg.img_size)
    x = torch.randn(args.batch_size, cfg.in_chans, *size, device=device)
    with torch.no_grad():
        y = model(x)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model:        {entry.name} ({entry.family})" + (f"  aliases: {', '.join(aliases_of(entry.name))}"
                                                           if aliases_of(entry.name) else ""))
    print(f"parameters:   {n_params:,} ({n_params / 1e6:.2f} M)")
    print(f"input shape:  {list(x.shape)}")
    print(f"output shape: {list(y.shape)}")
    print(f"config:       {cfg.to_json()}")
    return 0


def _models(args: argparse.Namespace) -> int:
    from .weights.hub import list_pretrained

    def lister(pattern: str) -> list[str]:
        if args.pretrained:  # NAME.TAG pairs with published weights, what --pretrained can load
            return list_pretrained(pattern if pattern.endswith("*") else pattern + ".*")
        return list_models(pattern, include_aliases=args.aliases)

    what = "model with published weights" if args.pretrained else "model"
    names = lister(args.pattern)
    wider = f"*{args.pattern.strip('*')}*"
    if not names and wider != args.pattern and lister(wider):
        # 'dino*' finds nothing (the names read vit_base_patch14_dinov2): the name holding it is what was meant
        print(f"vit-attention models: no registered {what} matches {args.pattern!r}; these match {wider!r}:",
              file=sys.stderr)
        names = lister(wider)
    if not names:
        print(f"vit-attention models: no registered {what} matches {args.pattern!r} "
              "(a glob: 'swin*', '*deit*'; `vit-attention models` lists them all)", file=sys.stderr)
        return 1
    for name in names:
        print(name)
    return 0


def _attention(args: argparse.Namespace) -> int:
    names = list_attention(args.pattern)
    if not names:
        print(f"vit-attention attention: no registered mechanism matches {args.pattern!r} "
              f"(registered: {', '.join(list_attention())})", file=sys.stderr)
        return 1
    for name in names:
        spec = get_attention_spec(name)
        print(f"{name:24s} {spec.layout:8s} {spec.description}")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``summary``, ``models`` and ``attention``."""
    p = sub.add_parser("summary", help="build a model by name and print params and output shape")
    p.add_argument("model", help="registered name or alias (vit-attention models lists them), or a run folder / "
                                 "checkpoint file of ours")
    p.add_argument("--img-size", type=positive_int, default=None, help="input size (default: the preset's)")
    p.add_argument("--num-classes", type=int, default=None, help="classifier size (default: the preset's)")
    p.add_argument("--batch-size", type=int, default=1, help="batch of the random input (default: 1)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, or meta (shapes only, no memory)")
    p.add_argument("--meta", action="store_true", help="build on the meta device (instant for giant models)")
    add_model_arg_option(p)
    p.set_defaults(func=_summary)
    p = sub.add_parser("models", help="list registered model names")
    p.add_argument("pattern", nargs="?", default="*", help="glob, e.g. 'swin*'")
    p.add_argument("--aliases", action="store_true", help="include torchvision-style aliases")
    p.add_argument("--pretrained", action="store_true",
                   help="list NAME.TAG for every preset tag with published weights (what --pretrained loads)")
    p.set_defaults(func=_models)
    p = sub.add_parser("attention", help="list registered attention mechanisms")
    p.add_argument("pattern", nargs="?", default="*", help="glob, e.g. 'window*' (default: all)")
    p.set_defaults(func=_attention)
