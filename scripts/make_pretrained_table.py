"""Print or check the families' pretrained tags (``PRETRAINED`` in each family file) against timm.

The package never imports timm: each family file (``vit_attention/models/<family>.py``) declares its
pretrained tags compactly, ``"name.tag": overrides`` on top of a few named data configs and family
defaults (:mod:`vit_attention.models.pretrained_tags`), and :mod:`vit_attention.models.pretrained_table` expands
them into ``DEFAULT_TAGS`` / ``PRETRAINED_CFGS``. This script reads timm 1.0.31's pretrained configs
(facts only: hub ids, licenses, classes, input sizes, normalisation, crops) and

* prints the ``PRETRAINED`` block of every family (or of ``--family NAME``) for its family file, plus
  the ``from .pretrained_tags import ...`` line that block needs; paste it over the family's block;
* ``--check``: exits 1 when the expanded tables of the package differ from timm's (and says where).

It needs the side environment that has timm (see ``tests/fixtures/README.md``); timm does not import
with the package's CPU-only torch, so it cannot run in the package's own environment::

    /tmp/ref/bin/python scripts/make_pretrained_table.py --check            # exit 1 if a family is stale
    /tmp/ref/bin/python scripts/make_pretrained_table.py --family swin       # print swin's block
    /tmp/ref/bin/python scripts/make_pretrained_table.py --check --write-snapshot  # re-pin the snapshot

``--from-package`` renders the blocks from the package's current tables instead of timm (no timm
needed).

For every registered preset of ours whose name is a timm architecture, every tag timm lists for it
is recorded (the default tag first, as timm orders them). Tags without downloadable weights
(``untrained``) are kept only for the data config of architectures that have no weights at all.
Entries for presets timm does not have (the original ViT ImageNet-21k models with their
representation layer, published by Google on the Hugging Face hub) are written from ``EXTRA``
below; their data configs follow the repositories' ``preprocessor_config.json`` (squash-resize to
224, bilinear, mean = std = 0.5). ``tests/models/test_pretrained_table.py`` pins the expanded tables
to ``tests/fixtures/pretrained_table.json`` (written from the last generated table).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vit_attention.models import pretrained_tags as P  # noqa: E402 - after the path is set

_HF_VIT_21K = dict(P.data_cfg(224, 1.0, mean=P.INCEPTION_MEAN, std=P.INCEPTION_STD, interpolation="bilinear",
                              crop_mode="squash"), num_classes=0, license="apache-2.0", hf_hub_filename=None)
EXTRA: dict[str, tuple[str, dict[str, Any]]] = {
    f"vit_{size}_patch{patch}_224_in21k": ("orig_in21k", dict(_HF_VIT_21K,
                                                              hf_hub_id=f"google/vit-{size}-patch{patch}-224-in21k"))
    for size, patch in (("base", 16), ("base", 32), ("large", 16), ("large", 32), ("huge", 14))
}

# Normalisations written by name in the family files.
_NORMS: dict[tuple[float, ...], str] = {P.INCEPTION_MEAN: "INCEPTION_MEAN", P.OPENAI_CLIP_MEAN: "OPENAI_CLIP_MEAN"}
_NORM_LABELS: dict[tuple[float, ...], str] = {P.IMAGENET_MEAN: "IMAGENET", P.INCEPTION_MEAN: "INCEPTION",
                                              P.OPENAI_CLIP_MEAN: "CLIP"}
_DATA = ("input_size", "interpolation", "crop_pct", "crop_mode", "mean", "std")
_WIDTH = 120


def from_timm() -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    """``(DEFAULT_TAGS, PRETRAINED_CFGS)`` for our registered presets, from timm (default tag first per name)."""
    import timm  # only in the side environment
    from timm.models import _registry

    from vit_attention.models.registry import list_models

    def cfg_dict(cfg: Any) -> dict[str, Any]:  # timm's PretrainedCfg
        d = {f: getattr(cfg, f) for f in P.FIELDS}
        for key in ("input_size", "mean", "std"):
            d[key] = tuple(d[key])
        return d

    if timm.__version__ != "1.0.31":
        print(f"note: timm {timm.__version__}; the family files say 1.0.31", file=sys.stderr)
    defaults: dict[str, str] = {}
    cfgs: dict[str, dict[str, Any]] = {}
    for name in list_models():
        if name in EXTRA:
            tag, cfg = EXTRA[name]
            defaults[name] = tag
            cfgs[f"{name}.{tag}"] = {f: cfg[f] for f in P.FIELDS}
            continue
        if name not in _registry._model_default_cfgs:
            continue
        tags = list(_registry._model_default_cfgs[name].tags)
        by_tag = _registry.get_arch_pretrained_cfgs(name)

        def cfg_of(tag: str, name: str = name, by_tag: dict = by_tag) -> Any:
            return by_tag.get(f"{name}.{tag}") or by_tag[name]  # an untagged architecture is keyed by its name

        with_weights = [t for t in tags if cfg_of(t).hf_hub_id]
        kept = with_weights or tags[:1]
        if not kept[0]:  # untagged and without weights (e.g. davit_giant): only its data config
            kept = ["untrained"]
        defaults[name] = kept[0]
        for tag in kept:
            cfgs[f"{name}.{tag}"] = cfg_dict(cfg_of(tag))
    return defaults, cfgs


def from_package() -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    """The package's current ``(DEFAULT_TAGS, PRETRAINED_CFGS)``."""
    from vit_attention.models.pretrained_table import DEFAULT_TAGS, PRETRAINED_CFGS

    return dict(DEFAULT_TAGS), {k: dict(v) for k, v in PRETRAINED_CFGS.items()}


def family_of(name: str) -> str:
    """The family module (``vit_attention/models/<module>.py``) that registers preset ``name``."""
    from vit_attention.models.registry import get_model_entry

    return get_model_entry(name).model_cls.__module__.rsplit(".", 1)[-1]


def _crop_label(crop_pct: float) -> str:
    return "C" + f"{crop_pct * 100:g}".replace(".", "_")


def _labels(d: tuple) -> tuple[str, str, str]:
    """``(resize, normalisation, crop)`` labels of a data config (timm's usual resize has none)."""
    _, interpolation, crop_pct, crop_mode, mean, _ = d
    resize = "" if (interpolation, crop_mode) == ("bicubic", "center") else f"{crop_mode}_{interpolation}".upper()
    return resize, _NORM_LABELS.get(mean, "NORM"), _crop_label(crop_pct)


def _data_names(datas: Sequence[tuple]) -> dict[tuple, str]:
    """A variable name per distinct data config: its size, plus only what tells it from the others of that size.

    Resize mode, then normalisation, then crop: each is named when it still varies among the configs
    that agree with this one so far (``_224_CLIP``, ``_224_IMAGENET_C90``, ``_256_C95``).
    """
    names: dict[tuple, str] = {}
    for d in datas:
        size = d[0][1] if d[0][1] == d[0][2] else f"{d[0][1]}x{d[0][2]}"
        parts, rest = [str(size)], [o for o in datas if o[0] == d[0]]
        for i in range(3):
            if len({_labels(o)[i] for o in rest}) > 1:
                parts.append(_labels(d)[i])
                rest = [o for o in rest if _labels(o)[i] == _labels(d)[i]]
        name = "_" + "_".join(p for p in parts if p)
        while name in names.values():
            name += "_"
        names[d] = name
    return names


def _lit(value: Any) -> str:
    """``value`` as Python source, strings in double quotes."""
    return json.dumps(value) if isinstance(value, str) else repr(value)


def _data_cfg_call(d: tuple) -> list[str]:
    """The arguments of ``data_cfg(...)`` for data config ``d``."""
    (_, h, w), interpolation, crop_pct, crop_mode, mean, std = d
    if h != w:
        raise ValueError(f"non-square input {d[0]}: data_cfg takes one size")
    args = [str(h), repr(crop_pct)]
    if (mean, std) != (P.IMAGENET_MEAN, P.IMAGENET_STD):
        stds = {P.INCEPTION_STD: "INCEPTION_STD", P.OPENAI_CLIP_STD: "OPENAI_CLIP_STD"}
        args += [f"mean={_NORMS.get(mean, repr(mean))}", f"std={stds.get(std, repr(std))}"]
    if interpolation != "bicubic":
        args.append(f"interpolation={_lit(interpolation)}")
    if crop_mode != "center":
        args.append(f"crop_mode={_lit(crop_mode)}")
    return args


def _wrap(head: str, args: list[str], tail: str) -> list[str]:
    """``head + ", ".join(args) + tail`` in lines of at most ``_WIDTH`` characters (continuations under ``(``)."""
    indent = head.rindex("(") + 1
    lines, line = [], head
    for i, arg in enumerate(args):
        piece = arg + (", " if i < len(args) - 1 else tail)
        if len(line) + len(piece.rstrip()) > _WIDTH and line.strip() != head.strip():
            lines.append(line.rstrip())
            line = " " * indent
        line += piece
    return [*lines, line]


def render_family(module: str, defaults: dict[str, str], cfgs: dict[str, dict[str, Any]]) -> tuple[str, str]:
    """``(import line, block)``: the ``PRETRAINED`` declaration of family ``module`` for its file."""
    keys = [k for k in cfgs if family_of(k.split(".", 1)[0]) == module]
    names = sorted({k.split(".", 1)[0] for k in keys})
    ordered = []
    for name in names:  # the default tag first, then the others as listed
        ordered.append(f"{name}.{defaults[name]}")
        ordered += [k for k in keys if k.split(".", 1)[0] == name and k != ordered[-1] and k not in ordered]
    datas = list(dict.fromkeys(tuple(cfgs[k][f] for f in _DATA) for k in ordered))
    datas.sort(key=lambda d: (d[0][1], -d[2], d[4] != P.IMAGENET_MEAN, d[1], d[3]))
    var = _data_names(datas)
    license_ = Counter(cfgs[k]["license"] for k in ordered).most_common(1)[0][0]

    used = {"data_cfg", "pretrained_tags"}
    lines = ["# ---------------------------------------------------------------------------- pretrained tags (data)",
             "# timm 1.0.31's pretrained configs (scripts/make_pretrained_table.py); a name's first tag is its",
             "# default; hf_hub_id: timm/<name>.<tag> unless given; num_classes: 1000 unless given."]
    for d in datas:
        args = _data_cfg_call(d)
        used.update(re.findall(r"\b[A-Z][A-Z_]+_(?:MEAN|STD)\b", " ".join(args)))
        lines += _wrap(f"{var[d]} = data_cfg(", args, ")")
    lines.append("PRETRAINED = pretrained_tags({")
    for key in ordered:
        cfg = cfgs[key]
        base = var[tuple(cfg[f] for f in _DATA)]
        implied = {"hf_hub_id": f"timm/{key}", "hf_hub_filename": None, "num_classes": 1000, "license": license_}
        over = [f"{f}={_lit(cfg[f])}" for f in P.FIELDS if f in implied and cfg[f] != implied[f]]
        head = f"    {_lit(key)}: "
        if not over:
            lines.append(f"{head}{base},")
        else:
            lines += _wrap(f"{head}dict(", [base, *over], "),")
    lines.append(f"}}, license={_lit(license_)})")
    imports = f"from .pretrained_tags import {', '.join(sorted(used, key=lambda s: (s.islower(), s)))}"
    return imports, "\n".join(lines) + "\n"


def diff_tables(want: tuple[dict[str, str], dict[str, dict[str, Any]]],
                got: tuple[dict[str, str], dict[str, dict[str, Any]]]) -> list[str]:
    """What differs between two ``(DEFAULT_TAGS, PRETRAINED_CFGS)`` (``want``: timm's, ``got``: the package's)."""
    out = []
    for name in sorted(set(want[0]) | set(got[0])):
        if want[0].get(name) != got[0].get(name):
            out.append(f"default tag of {name}: timm {want[0].get(name)!r}, package {got[0].get(name)!r}")
    for key in sorted(set(want[1]) | set(got[1])):
        a, b = want[1].get(key), got[1].get(key)
        if a != b:
            fields = [f for f in P.FIELDS if (a or {}).get(f) != (b or {}).get(f)] if a and b else ["(missing)"]
            out.append(f"{key}: {', '.join(fields)} (family {family_of(key.split('.', 1)[0])})")
    return out


SNAPSHOT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "pretrained_table.json"


def write_snapshot() -> None:
    """``tests/fixtures/pretrained_table.json``: the package's expanded tables (tuples as JSON lists), in order."""
    from vit_attention.models.pretrained_table import DEFAULT_TAGS, PRETRAINED_CFGS

    text = json.dumps({"DEFAULT_TAGS": DEFAULT_TAGS, "PRETRAINED_CFGS": PRETRAINED_CFGS}, indent=1)
    tmp = SNAPSHOT.with_suffix(".json.tmp")
    tmp.write_text(text + "\n")
    tmp.replace(SNAPSHOT)  # atomic: a failed write never leaves half a snapshot
    print(f"wrote {SNAPSHOT} ({len(PRETRAINED_CFGS)} tags of {len(DEFAULT_TAGS)} models)")


def main(argv: Sequence[str] | None = None) -> int:
    """Print the family blocks, or ``--check`` the package against timm."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 when the package's tables differ from timm's")
    p.add_argument("--family", action="append", help="print only this family module's block (repeatable)")
    p.add_argument("--from-package", action="store_true", help="render from the package's tables, not timm")
    p.add_argument("--write-snapshot", action="store_true",
                   help="after --check passes, rewrite tests/fixtures/pretrained_table.json from the package's tables "
                        "(the pin tests/models/test_pretrained_table.py compares with)")
    args = p.parse_args(argv)
    if args.write_snapshot and not args.check:
        p.error("--write-snapshot needs --check: the snapshot is written only from tables that equal timm's")
    tables = from_package() if args.from_package else from_timm()
    if args.check:
        problems = diff_tables(tables, from_package())
        print("\n".join(problems) if problems else "up to date")
        if args.write_snapshot and not problems:
            write_snapshot()
        return 1 if problems else 0
    from vit_attention.models.families import builtin_families

    modules = sorted({family_of(k.split(".", 1)[0]) for k in tables[1]})
    for module in args.family or modules:
        if module not in builtin_families():
            p.error(f"unknown family module {module!r}")
        imports, block = render_family(module, *tables)
        print(f"# ==== vit_attention/models/{module}.py\n{imports}\n\n{block}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
