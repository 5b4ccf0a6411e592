"""Data-parallel training over ``torch.distributed``: rank 0 leads, the other ranks follow.

Under ``torchrun --nproc_per_node=N`` every rank holds the same :class:`~swarm.train.Trainer`.
Rank 0 alone runs the flow; it sends each batch to the others (:func:`broadcast_batch`), which
run :func:`swarm.update.follow`. Each rank forwards and backwards its share of the micro-batches
(:func:`shard`); loss weights are normalised over the whole batch, so the SUM of the ranks'
gradients (:func:`all_reduce_grads`) is the full-batch gradient and every rank steps identically,
in sync without DDP wrappers. Control messages travel on a gloo group even when gradients use
NCCL, so a follower waiting for the next batch sits in a CPU receive, not a GPU kernel.

Without a process group every function is a no-op (or the identity). It does not choose devices
for models, read config, or talk to the pool.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from swarm.merge import TrainSeq

__all__ = ["active", "rank", "world_size", "is_main", "local_device", "init_from_env", "shutdown", "shard",
           "all_reduce_grads", "all_reduce_sums", "all_reduce_max", "broadcast_params", "broadcast_object", "broadcast_batch"]

T = TypeVar("T")
_CONTROL: Any = None  # the gloo group for object broadcasts (None: the default group)
_BUCKET = 1 << 25  # elements per coalesced all-reduce (128 MiB of fp32)


def active() -> bool:
    """True when a process group with more than one rank is initialised."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if active() else 0


def world_size() -> int:
    return dist.get_world_size() if active() else 1


def is_main() -> bool:
    """Rank 0 (or no distributed run): the process that saves, publishes and logs."""
    return rank() == 0


def local_device(device: str) -> str:
    """``cuda`` becomes ``cuda:$LOCAL_RANK`` under torchrun; any other device string is kept."""
    if device == "cuda" and "LOCAL_RANK" in os.environ:
        return f"cuda:{int(os.environ['LOCAL_RANK'])}"
    return device


def init_from_env(device: str = "cpu", timeout_s: float = 24 * 3600) -> bool:
    """Initialise the process group when torchrun set ``WORLD_SIZE > 1``; True when distributed.

    NCCL for CUDA devices (after ``cuda.set_device(LOCAL_RANK)``; a gloo group carries control
    messages), else gloo. ``timeout_s`` bounds every collective, a follower's wait for a batch too.
    """
    global _CONTROL
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    if dist.is_initialized():
        return active()
    timeout = timedelta(seconds=timeout_s)
    cuda = device.startswith("cuda") and torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(torch.device(local_device(device)))
    dist.init_process_group(backend="nccl" if cuda else "gloo", timeout=timeout)
    _CONTROL = dist.new_group(backend="gloo", timeout=timeout) if cuda else None
    return active()


def shutdown() -> None:
    """Wait for every rank, then destroy the process group (if any).

    Without the barrier a rank finishing first tears down rank 0's store while another still talks
    to it, which then dies in C++ (``terminate called without an active exception``).
    """
    global _CONTROL
    if dist.is_available() and dist.is_initialized():
        dist.barrier(group=_CONTROL)
        dist.destroy_process_group()
    _CONTROL = None


def shard(groups: Sequence[T]) -> list[T]:
    """This rank's share of ``groups`` (round robin; groups come longest first, so shares are even)."""
    return list(groups[rank() :: world_size()])


def _buckets(tensors: list[torch.Tensor]) -> Iterator[list[torch.Tensor]]:
    """Consecutive tensors of one dtype and device, about ``_BUCKET`` elements each."""
    bucket: list[torch.Tensor] = []
    size = 0
    for t in tensors:
        if bucket and (size + t.numel() > _BUCKET or t.dtype != bucket[0].dtype or t.device != bucket[0].device):
            yield bucket
            bucket, size = [], 0
        bucket.append(t)
        size += t.numel()
    if bucket:
        yield bucket


def _coalesced_(tensors: list[torch.Tensor], op: Any) -> None:
    """``op`` (all-reduce, broadcast) in place on ``tensors``: a few flattened buckets, not one call per tensor."""
    for bucket in _buckets(tensors):
        flat = torch.cat([t.reshape(-1) for t in bucket])
        op(flat)
        offset = 0
        for t in bucket:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()


def all_reduce_grads(params: Sequence[torch.nn.Parameter]) -> None:
    """Sum every ``p.grad`` over ranks (in place) so each rank holds the full-batch gradient.

    A parameter some rank did not touch gets a zero gradient there first; one no rank touched
    keeps ``grad = None``, as in a single process (AdamW then skips it).
    """
    if not active() or not params:
        return
    touched = torch.tensor([p.grad is not None for p in params], dtype=torch.float32, device=params[0].device)
    dist.all_reduce(touched)
    grads = []
    for p, t in zip(params, touched.tolist(), strict=True):
        if t > 0:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
    _coalesced_(grads, dist.all_reduce)  # SUM over ranks


def all_reduce_sums(sums: Mapping[str, float], device: torch.device | str = "cpu") -> dict[str, float]:
    """``sums`` added over ranks (one all-reduce); ``device`` must suit the backend (CUDA for NCCL)."""
    if not active():
        return dict(sums)
    keys = list(sums)
    t = torch.tensor([float(sums[k]) for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return dict(zip(keys, t.tolist(), strict=True))


def all_reduce_max(values: Mapping[str, float], device: torch.device | str = "cpu") -> dict[str, float]:
    """``values``' maxima over ranks (one all-reduce); ``device`` as in :func:`all_reduce_sums`."""
    if not active():
        return dict(values)
    keys = list(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return dict(zip(keys, t.tolist(), strict=True))


def broadcast_params(params: Sequence[torch.nn.Parameter]) -> None:
    """Copy rank 0's values into ``params`` on every rank (e.g. after a random LoRA init)."""
    if not active() or not params:
        return
    with torch.no_grad():
        _coalesced_([p.data for p in params], lambda flat: dist.broadcast(flat, src=0))


def broadcast_object(obj: T) -> T:
    """Rank 0's picklable ``obj`` on every rank (others' argument is ignored)."""
    if not active():
        return obj
    box = [obj if is_main() else None]
    dist.broadcast_object_list(box, src=0, group=_CONTROL)
    return box[0]


def broadcast_batch(items: list[TrainSeq] | None, policy: str = "default",
                    version: int | None = None) -> list[TrainSeq] | None:
    """Rank 0 sends the batch it is about to train on ``policy`` (None: stop); returns it on every rank.
    ``version`` (rank 0's, before the update) keeps :func:`swarm.update.follow` in step."""
    msg = broadcast_object(None if items is None else (policy, version, list(items)))
    return None if msg is None else msg[2]
