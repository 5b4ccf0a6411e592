"""Flex attention for tree-packed rows: a ``BlockMask`` built from the tree, never a dense mask.

A packed row's tree is described by ``subtree_end`` (``swarm.merge.tensors``): query ``q`` sees
key ``k`` iff ``k <= q < subtree_end[k]`` (its ancestors and itself). :func:`tree_mask_mod` is
that rule as a flex-attention ``mask_mod``; :func:`tree_block_mask` builds the matching
``torch.nn.attention.flex_attention.BlockMask`` directly from the key intervals
``[k, subtree_end[k])``, so no ``(B, L, L)`` tensor is ever made: its largest intermediate is
``(B, L/128, L)`` and the mask it returns holds ``~B·L²/1024`` bytes of int32 block indices.
Blocks every query of which sees every key are marked *full* (flex skips the mask_mod there),
as ``create_block_mask`` does.

:func:`use_flex_attention` switches a transformers model to its ``flex_attention``
implementation, which takes a 4D ``BlockMask`` as ``attention_mask`` unchanged
(``masking_utils._preprocess_mask_arguments`` returns 4D masks as they are) and runs the
compiled flex kernel with it (``integrations/flex_attention.py``).

Not here: the dense boolean mask (``swarm.merge.tensors``) and the CPU block-sparse SDPA path
(``swarm.train.tree_attention``). Flex attention has no backward pass on CPU in torch 2.13
(``NotImplementedError`` from ``flex_attention``), so training with it needs a CUDA device;
a CPU forward without gradients works.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask

from swarm.errors import ValidationError

__all__ = ["FLEX_IMPL", "BLOCK", "tree_mask_mod", "tree_block_mask", "use_flex_attention", "check_flex_device"]

FLEX_IMPL = "flex_attention"
BLOCK = 128  # flex attention's default sparse block size

MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _padded_end(subtree_end: torch.Tensor, block: int) -> torch.Tensor:
    """``subtree_end`` padded to a whole number of blocks with 0 (padded keys are never seen)."""
    length = subtree_end.shape[-1]
    pad = -length % block
    return F.pad(subtree_end, (0, pad), value=0) if pad else subtree_end


def tree_mask_mod(subtree_end: torch.Tensor, block: int = BLOCK) -> MaskMod:
    """The tree rule as a flex ``mask_mod``: query ``q`` sees key ``k`` iff ``k <= q < end[b, k]``.

    ``end`` is padded to whole blocks so the kernel's reads past the row stay in bounds.
    """
    end = _padded_end(subtree_end, block)

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return (k <= q) & (q < end[b, k])

    return mask_mod


def _ordered(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(B, 1, nq, nk)`` bool -> (blocks per query block, their key-block indices first), int32."""
    as_int = blocks.to(torch.int32)
    return as_int.sum(-1, dtype=torch.int32), torch.argsort(as_int, dim=-1, descending=True, stable=True).to(torch.int32)


def tree_block_mask(subtree_end: torch.Tensor, block: int = BLOCK) -> BlockMask:
    """``(B, L)`` subtree ends -> the flex ``BlockMask`` of the tree mask (same pattern, same device).

    Key ``k`` is seen by some query of block ``[q0, q1)`` iff ``[k, end[k])`` meets it, and by all
    of them iff ``k <= q0`` and ``end[k] >= q1``; a key block is *partial* if some key is seen by
    some query and *full* if every key is seen by every query (never the last, cut block).
    """
    b, length = subtree_end.shape
    end = _padded_end(subtree_end, block)
    padded = end.shape[-1]
    nb = padded // block
    device = end.device
    k = torch.arange(padded, device=device)
    q0 = torch.arange(nb, device=device) * block
    q1 = torch.clamp(q0 + block, max=length)
    start = torch.maximum(k[None, :], q0[:, None])  # (nq, L): first query of the block that k may serve
    seen = start[None] < torch.minimum(end[:, None, :], q1[None, :, None])  # (B, nq, L)
    sees_all = (k[None, :] <= q0[:, None])[None] & (end[:, None, :] >= (q0 + block)[None, :, None])
    any_block = seen.view(b, nb, nb, block).any(-1)
    full_block = sees_all.view(b, nb, nb, block).all(-1)
    partial = (any_block & ~full_block)[:, None]
    kv_num, kv_idx = _ordered(partial)
    full_num, full_idx = _ordered(full_block[:, None])
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=block,
                                    mask_mod=tree_mask_mod(subtree_end, block), seq_lengths=(length, length))


def use_flex_attention(lm: Any) -> None:
    """Switch a transformers ``*ForCausalLM`` to its ``flex_attention`` implementation for good.

    For good, not per forward: with gradient checkpointing the backward recomputes each layer
    after the forward returned, and must take the same attention path. Raises ValidationError
    (naming ``train.attention``) when the architecture has no flex attention support.
    """
    if lm.config._attn_implementation == FLEX_IMPL:
        return
    try:
        lm.set_attn_implementation(FLEX_IMPL)
    except (ValueError, ImportError) as exc:
        raise ValidationError(f"train.attention='flex': {type(lm).__name__} cannot use flex attention ({exc}); "
                              "use train.attention='dense'") from exc
    if lm.config._attn_implementation != FLEX_IMPL:
        raise ValidationError(f"train.attention='flex': {type(lm).__name__} did not switch to flex attention; "
                              "use train.attention='dense'")


def check_flex_device(device: torch.device, needs_grad: bool) -> None:
    """Refuse a flex forward that needs gradients on CPU (torch has no flex backward there)."""
    if needs_grad and device.type == "cpu":
        raise ValidationError(f"train.attention='flex' needs a CUDA device to train: flex attention has no backward "
                              f"pass on CPU (torch {torch.__version__}); use train.attention='dense' on CPU")
