"""Packed rows to tensors: micro-batches, padding, the tree attention mask and target gathers.

``collate`` turns a few :class:`PackedRow` into model inputs. Rows that are all plain causal
sequences get no mask at all (the model's own causal path, the fastest kernels); otherwise a
boolean 4D mask ``(B, 1, L, L)`` is built from ``subtree_end``: True where attention is allowed.
Padding tokens attend only to themselves and nothing attends to them. The padded ``subtree_end``
``(B, L)`` travels with it, so a flex-attention forward can build its block mask from the tree
instead (``swarm.train.flex_mask``); ``dense_mask=False`` then skips the ``B·L²`` bytes of the
boolean mask.

This module does not run the model (see ``swarm.train.forward``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from swarm.merge.layout import PackedRow

__all__ = ["Collated", "collate", "micro_batches", "tree_attention_mask"]


@dataclass
class Collated:
    """Model inputs for one micro-batch, plus where each target's logits come from."""

    input_ids: torch.Tensor  # (B, L) long
    position_ids: torch.Tensor | None  # (B, L) long, None on the causal fast path
    attention_mask: torch.Tensor | None  # (B, 1, L, L) bool, None on the causal fast path
    predict_row: torch.Tensor  # (T,) row of the predicting token
    predict_pos: torch.Tensor  # (T,) position of the predicting token in that row
    target_ids: torch.Tensor  # (T,)
    target_item: torch.Tensor  # (T,) index into the batch's items
    target_offset: torch.Tensor  # (T,) response token index within the item
    n_tokens: int  # real (unpadded) tokens
    subtree_end: torch.Tensor | None = None  # (B, L) long, None on the causal fast path


def micro_batches(rows: list[PackedRow], token_budget: int) -> list[list[int]]:
    """Row indices grouped so that rows x padded length <= ``token_budget`` (longest first).

    A row longer than the budget goes alone. Sorting by length keeps padding small.
    """
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
    groups: list[list[int]] = []
    for i in order:
        if groups and (len(groups[-1]) + 1) * len(rows[groups[-1][0]]) <= token_budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def tree_attention_mask(subtree_end: torch.Tensor) -> torch.Tensor:
    """``(B, L)`` subtree ends -> ``(B, 1, L, L)`` bool: query i sees key j iff j <= i < end[j]."""
    length = subtree_end.shape[-1]
    idx = torch.arange(length, device=subtree_end.device)
    causal = idx[None, :] <= idx[:, None]  # (L_q, L_k)
    inside = idx[None, :, None] < subtree_end[:, None, :]  # (B, L_q, L_k)
    return (causal[None] & inside)[:, None]


def collate(rows: list[PackedRow], pad_id: int = 0, force_mask: bool = False, dense_mask: bool = True) -> Collated:
    """Pad rows on the right and build the mask (skipped when every row is a plain chain).

    ``dense_mask=False``: keep only ``subtree_end`` (``attention_mask`` None) for a forward that
    builds its own mask from it.
    """
    length = max(len(r) for r in rows)
    b = len(rows)
    ids = torch.full((b, length), pad_id, dtype=torch.long)
    pos = torch.zeros((b, length), dtype=torch.long)
    end = torch.arange(1, length + 1, dtype=torch.long).repeat(b, 1)  # pads: themselves only
    pr, pp, tid, ti, to = [], [], [], [], []
    for r, row in enumerate(rows):
        n = len(row)
        ids[r, :n] = torch.tensor(row.input_ids, dtype=torch.long)
        pos[r, :n] = torch.tensor(row.position_ids, dtype=torch.long)
        end[r, :n] = torch.tensor(row.subtree_end, dtype=torch.long)
        pr.extend([r] * len(row.predict_index))
        pp.extend(row.predict_index)
        tid.extend(row.target_ids)
        ti.extend(row.target_item)
        to.extend(row.target_offset)
    chains = not force_mask and all(row.is_chain for row in rows)
    return Collated(input_ids=ids, position_ids=None if chains else pos,
                    attention_mask=None if chains or not dense_mask else tree_attention_mask(end),
                    predict_row=torch.tensor(pr, dtype=torch.long), predict_pos=torch.tensor(pp, dtype=torch.long),
                    target_ids=torch.tensor(tid, dtype=torch.long), target_item=torch.tensor(ti, dtype=torch.long),
                    target_offset=torch.tensor(to, dtype=torch.long), n_tokens=sum(len(r) for r in rows),
                    subtree_end=None if chains else end)
