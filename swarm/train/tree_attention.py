"""Block-sparse attention for tree-packed rows: skip key blocks a query block never sees.

CPU SDPA kernels do not skip fully masked blocks, so a dense tree mask costs ``L^2`` even when
most of it is masked (nine players' branches in one row see only the shared prompt and their
own branch). :func:`block_plan` cuts each row into query blocks and, for each, lists the key
blocks holding any ancestor of its queries; :func:`tree_sdpa_attention` then runs one SDPA call
per query block over just those keys with the matching slice of the boolean mask. The result
is the same attention (masked keys contribute exactly zero either way) at a cost close to
``sum over tokens of (ancestors + block)``.

It is registered with transformers as the attention implementation ``swarm_tree_sdpa`` and
used only while :func:`tree_attention` is active and a plan is passed; without a plan it is
plain SDPA. Not a GPU kernel: on GPUs use flex attention with a block mask instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = ["BlockPlan", "block_plan", "tree_sdpa_attention", "tree_attention", "install_tree_attention", "IMPL"]

IMPL = "swarm_tree_sdpa"


@dataclass
class BlockPlan:
    """Per batch row: ``(q_start, q_end, key_index, mask_slice)`` for each query block."""

    rows: list[list[tuple[int, int, torch.Tensor, torch.Tensor]]]


def block_plan(mask: torch.Tensor, block: int = 128) -> BlockPlan:
    """From a ``(B, 1, L, L)`` bool mask, the key blocks each query block needs."""
    b, _, length, _ = mask.shape
    nb = (length + block - 1) // block
    pad = nb * block - length
    m = F.pad(mask[:, 0], (0, pad, 0, pad))
    need = m.view(b, nb, block, nb, block).any(dim=4).any(dim=2)  # (B, nq, nk)
    rows = []
    for r in range(b):
        plan = []
        for q in range(nb):
            q0, q1 = q * block, min((q + 1) * block, length)
            kb = need[r, q].nonzero().flatten().tolist()
            idx = torch.cat([torch.arange(k * block, min((k + 1) * block, length)) for k in kb])
            plan.append((q0, q1, idx, mask[r : r + 1, :, q0:q1][..., idx]))
        rows.append(plan)
    return BlockPlan(rows)


def tree_sdpa_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                        swarm_tree_plan: BlockPlan | None = None, **kwargs):
    """transformers attention interface: ``(B, H, L, D)`` in, ``(B, L, H, D)`` out."""
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    if swarm_tree_plan is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    out_rows = []
    for r, plan in enumerate(swarm_tree_plan.rows):
        pieces = []
        for q0, q1, idx, sub in plan:
            idx = idx.to(key.device)
            pieces.append(F.scaled_dot_product_attention(
                query[r : r + 1, :, q0:q1], key[r : r + 1, :, idx], value[r : r + 1, :, idx],
                attn_mask=sub.to(query.device), dropout_p=dropout, scale=scaling,
            ))
        out_rows.append(torch.cat(pieces, dim=2))
    return torch.cat(out_rows, dim=0).transpose(1, 2).contiguous(), None


_registered = False


def _register() -> None:
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(IMPL, tree_sdpa_attention)
    if IMPL not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
        AttentionMaskInterface.register(IMPL, sdpa_mask)
    _registered = True


@contextlib.contextmanager
def tree_attention(lm: torch.nn.Module) -> Iterator[None]:
    """Switch an SDPA model to :func:`tree_sdpa_attention` for the duration of a forward."""
    _register()
    old = lm.config._attn_implementation
    lm.config._attn_implementation = IMPL
    try:
        yield
    finally:
        lm.config._attn_implementation = old


def install_tree_attention(lm: torch.nn.Module) -> None:
    """Switch an SDPA model to :func:`tree_sdpa_attention` for good (plain SDPA whenever no plan is passed).

    Needed with gradient checkpointing: the backward recomputes each layer after the forward's
    :func:`tree_attention` context has ended, and must take the same attention path.
    """
    if lm.config._attn_implementation in ("sdpa", IMPL):
        _register()
        lm.config._attn_implementation = IMPL
