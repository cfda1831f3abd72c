"""Multi-process data parallel training under ``torchrun``: process group, model wrapping, reductions.

``torchrun --nproc_per_node N -m vit_attention.cli train ...`` sets ``RANK`` / ``WORLD_SIZE`` /
``LOCAL_RANK``; :func:`init_distributed` then joins the group (NCCL on CUDA, Gloo on CPU).
Every rank sees its share of each global batch, gradients are averaged by DDP (or sharded by
FSDP with ``fsdp=True``), metrics are summed over ranks, and only rank 0 writes files.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

__all__ = ["DistInfo", "init_distributed", "cleanup_distributed", "wrap_model", "unwrap_model", "is_fsdp",
           "all_reduce_sum",
           "broadcast_object", "full_state_dict", "full_optimizer_state", "load_optimizer_state", "no_sync"]


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits: ``rank`` of ``world_size``, its device, and whether it writes files."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        """True on rank 0, the only rank that writes checkpoints and logs."""
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        """True when more than one process trains."""
        return self.world_size > 1


def init_distributed(device: str | None = None) -> DistInfo:
    """Join the ``torchrun`` process group if its environment is set, and pick this rank's device.

    ``device``: ``"cpu"``, ``"cuda"`` or ``None`` (CUDA when available). Backend: NCCL on CUDA,
    Gloo on CPU.
    """
    want = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if want.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} requested but CUDA is not available; use --device cpu")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if want.startswith("cuda"):
        dev = torch.device("cuda", local if world > 1 else (torch.device(want).index or 0))
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
    return DistInfo(rank, world, local, dev)


def cleanup_distributed(sync: bool = False) -> None:
    """Leave the process group (no-op when none); ``sync`` waits for every rank first (normal exit only:
    after a failure on one rank the others would wait for it)."""
    if dist.is_available() and dist.is_initialized():
        if sync and dist.get_world_size() > 1:
            dist.barrier()
        dist.destroy_process_group()


def wrap_model(model: nn.Module, info: DistInfo, *, fsdp: bool = False) -> nn.Module:
    """``model`` as trained by this process: itself, DDP-wrapped, or sharded in place with FSDP2 (``fsdp=True``).

    FSDP shards every transformer block and then the root (``torch.distributed.fsdp.fully_shard``;
    parameters become DTensors), on CUDA or, with Gloo, on CPU.
    """
    if fsdp:
        if not dist.is_initialized():  # FSDP needs a process group, even a single-process one
            import tempfile

            store = tempfile.NamedTemporaryFile(prefix="vit_attention_pg_", delete=False).name
            dist.init_process_group(backend="nccl" if info.device.type == "cuda" else "gloo",
                                    init_method=f"file://{store}", rank=0, world_size=1)
        from torch.distributed.fsdp import fully_shard

        for name in ("blocks", "layers", "stages"):
            for sub in getattr(model, name, []):
                fully_shard(sub)
        fully_shard(model)
        model._vit_attention_fsdp = True  # type: ignore[assignment]
        return model
    if not info.enabled:
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(model, device_ids=[info.device.index] if info.device.type == "cuda" else None)


def unwrap_model(model: nn.Module) -> nn.Module:
    """The bare model inside a DDP wrapper (FSDP2 shards in place: the model itself)."""
    return getattr(model, "module", model)


def is_fsdp(model: nn.Module) -> bool:
    """True for a model sharded by :func:`wrap_model` with ``fsdp=True``."""
    return bool(getattr(model, "_vit_attention_fsdp", False))


def _full_options() -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """The complete, unsharded state dict of a (possibly wrapped) model (under FSDP: complete on rank 0)."""
    if is_fsdp(model):
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return dict(get_model_state_dict(model, options=_full_options()))
    return dict(unwrap_model(model).state_dict())


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """``optimizer.state_dict()``; under FSDP gathered to full tensors keyed by parameter name (on rank 0)."""
    if is_fsdp(model):
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return dict(get_optimizer_state_dict(model, optimizer, options=_full_options()))
    return optimizer.state_dict()


def load_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load a full optimizer state (from :func:`full_optimizer_state`) into ``optimizer``."""
    if is_fsdp(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))
        return
    optimizer.load_state_dict(state)


def all_reduce_sum(t: Tensor) -> Tensor:
    """Sum ``t`` over all ranks (returns ``t`` itself when not distributed)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` on every rank (identity when not distributed)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]
    return obj


@contextmanager
def no_sync(model: nn.Module, skip: bool) -> Iterator[None]:
    """Skip the gradient all-reduce of a DDP / FSDP model for an accumulation micro-step when ``skip``."""
    if skip and hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
        return
    ctx = model.no_sync() if skip and hasattr(model, "no_sync") else nullcontext()
    with ctx:
        yield
