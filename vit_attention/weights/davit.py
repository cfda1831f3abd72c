"""DaViT checkpoint layouts onto ours: timm, the original dingmyu/davit repository, Florence-2's vision tower.

Ours is timm's (``models/davit.py``) except inside the blocks, where the one ``Block`` names the
two position layers ``pos`` / ``pos2`` (timm ``cpe1`` / ``cpe2``) and the pair members are always
``.0`` (spatial) / ``.1`` (channel) (timm's ``_fl`` models name them ``spatial_block`` /
``channel_block``). Those renames are an adapter, so they run for every layout, ``format="timm"``
included:

* timm (``davit_*``, ``davit_*_fl``): ``stem``, ``stages.N.{downsample,blocks.M.{0,1}}``, ``head``;
* original dingmyu/davit: ``patch_embeds.N.{proj,norm}`` (N = 0: the stem), ``main_blocks.N.M.{0,1}``
  with ``cpe.{0,1}``, ``norms`` (the head's norm), ``head`` (the classifier);
* Florence-2 (``microsoft/Florence-2-*``): the vision tower of the whole checkpoint (everything
  else: language model, projector, is dropped), in the hub's remote-code names
  (``vision_tower.convs.N.proj``, ``blocks.N.M.spatial_block.conv1.fn.dw``, ``window_attn.fn.qkv``,
  ``window_attn.norm``, ``ffn.fn.net.fc1``, ...) or transformers' ``Florence2VisionBackbone`` names
  (``[model.]vision_tower.convs.N.conv``, ``blocks.N.M.spatial_block.conv1``, ``window_attn.qkv``,
  ``ffn.fc1``, ...). The tower has no classifier: load it into a ``features_only`` model (its
  head is ignored) or with ``strict=False`` (``head.*`` left as initialised). Use a ``davit_*_fl``
  preset (Florence-2's channel attention form, window 12, 3x3 downsampling).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from .layouts import register_adapter, register_converter, rename
from .vit import drop_mismatched_heads

__all__ = ["TIMM_BLOCK_RULES", "ORIGINAL_RULES", "FLORENCE2_RULES"]

State = dict[str, Tensor]

# timm block names -> ours (also the last step of every other layout)
TIMM_BLOCK_RULES: list[tuple[str, str]] = [
    (r"\.spatial_block\.", ".0."),
    (r"\.channel_block\.", ".1."),
    (r"\.cpe1\.", ".pos."),
    (r"\.cpe2\.", ".pos2."),
]



def _embed_rules(prefix: str, conv: str) -> list[tuple[str, str]]:
    """Rules for a DaViT checkpoint whose patch embeddings are ``<prefix>.<i>`` (a ``conv`` then a ``norm``): the
    first is our stem, the others the stages' downsamples."""
    return [(rf"^{prefix}\.0\.{conv}\.", "stem.conv."), (rf"^{prefix}\.0\.norm\.", "stem.norm."),
            (rf"^{prefix}\.(\d+)\.{conv}\.", r"stages.\1.downsample.conv."),
            (rf"^{prefix}\.(\d+)\.norm\.", r"stages.\1.downsample.norm.")]


# dingmyu/davit -> timm
ORIGINAL_RULES: list[tuple[str, str]] = [
    *_embed_rules("patch_embeds", "proj"),
    (r"^main_blocks\.(\d+)\.", r"stages.\1.blocks."),
    (r"\.cpe\.0\.", ".cpe1."),
    (r"\.cpe\.1\.", ".cpe2."),
    (r"^norms\.", "head.norm."),
    (r"^head\.(weight|bias)$", r"head.fc.\1"),
]

# Florence-2 vision tower (remote code and transformers names) -> timm; applied after the prefix is cut
FLORENCE2_RULES: list[tuple[str, str]] = [
    *_embed_rules("convs", "(?:proj|conv)"),
    (r"^blocks\.(\d+)\.", r"stages.\1.blocks."),
    (r"\.conv1\.fn\.dw\.", ".cpe1.proj."),  # remote code: PreNorm / Residual wrappers
    (r"\.conv2\.fn\.dw\.", ".cpe2.proj."),
    (r"\.(?:window|channel)_attn\.norm\.", ".norm1."),
    (r"\.(?:window|channel)_attn\.fn\.", ".attn."),
    (r"\.ffn\.norm\.", ".norm2."),
    (r"\.ffn\.fn\.net\.", ".mlp."),
    (r"\.conv1\.", ".cpe1.proj."),  # transformers: plain convs and names
    (r"\.conv2\.", ".cpe2.proj."),
    (r"\.(?:window|channel)_attn\.", ".attn."),
    (r"\.ffn\.", ".mlp."),
]

_FLORENCE2_PREFIX = re.compile(r"^(?:model\.)?vision_tower\.")


def _is_original(state: Mapping[str, Tensor]) -> bool:
    return any(k.startswith("main_blocks.") for k in state) and any(k.startswith("patch_embeds.") for k in state)


def _from_original(state: State, model: nn.Module) -> State:
    return rename(state, ORIGINAL_RULES)


def _is_florence2(state: Mapping[str, Tensor]) -> bool:
    return any(_FLORENCE2_PREFIX.match(k) and ".convs.0." in k for k in state) or (
        any(k.startswith("convs.0.") for k in state) and any(".spatial_block." in k for k in state))


def _from_florence2(state: State, model: nn.Module) -> State:
    prefixed = any(_FLORENCE2_PREFIX.match(k) for k in state)
    tower = {_FLORENCE2_PREFIX.sub("", k): v for k, v in state.items() if not prefixed or _FLORENCE2_PREFIX.match(k)}
    return rename(tower, FLORENCE2_RULES)


def _adapt_davit(state: State, model: nn.Module, report: Any) -> State:
    """timm's block names -> ours (every layout); a classifier for another class count is dropped."""
    if any(".cpe1." in k or ".cpe2." in k or "_block." in k for k in state):
        state = rename(state, TIMM_BLOCK_RULES)
        report.notes.append("timm block names cpe1 / cpe2 (spatial_block / channel_block) -> pos / pos2 (.0 / .1)")
    return drop_mismatched_heads(state, model.state_dict(), ("head.fc.",), report)


register_converter("davit", "original", _is_original, _from_original)
register_converter("davit", "florence2", _is_florence2, _from_florence2)
register_adapter("davit", _adapt_davit)
