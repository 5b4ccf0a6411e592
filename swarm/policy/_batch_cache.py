"""The running batch's KV cache for continuous batching: rows leave at once, new rows join between steps.

The cache is transformers' ``DynamicCache`` (per layer ``[batch, heads, length, head_dim]``),
left-padded with an attention mask, so rows of different lengths coexist; padded, not paged,
because that is what the eager attention kernels of transformers take unchanged (a paged cache
needs transformers' own continuous-batching runner, which lacks per-row seeds, grammar masks
and adapters: docs/policy.md). A row that finishes is dropped from every layer
(:func:`select_rows`), then the leading columns no remaining row uses are cut
(:func:`trim_left`); rows prefilled apart join by left-padding both caches to one length and
concatenating along the batch (:func:`merge`). Only plain full-attention layers are merged;
:func:`mergeable` says whether a cache qualifies (sliding-window or quantized layers do not: their
batch then runs to its end as before).

Pure tensor operations on cache objects; no model calls, no sampling.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["mergeable", "select_rows", "trim_left", "merge"]


def _layers(cache: Any) -> list[Any] | None:
    layers = getattr(cache, "layers", None)
    return list(layers) if layers is not None else None


def mergeable(cache: Any) -> bool:
    """Whether rows can join this cache: every layer a plain, initialised full-attention ``DynamicLayer``."""
    from transformers.cache_utils import DynamicLayer

    layers = _layers(cache)
    return bool(layers) and all(type(x) is DynamicLayer and getattr(x, "is_initialized", False)
                                and isinstance(getattr(x, "keys", None), torch.Tensor) and x.keys.dim() == 4
                                for x in layers)


def select_rows(cache: Any, index: torch.Tensor) -> None:
    """Keep only the rows ``index`` (in that order) in every layer."""
    cache.batch_select_indices(index)


def trim_left(cache: Any, columns: int) -> None:
    """Drop the first ``columns`` positions of every layer (padding no remaining row attends to)."""
    if columns <= 0:
        return
    for layer in _layers(cache) or []:
        layer.keys = layer.keys[:, :, columns:, :]
        layer.values = layer.values[:, :, columns:, :]


def _left_pad(t: torch.Tensor, length: int) -> torch.Tensor:
    extra = length - t.shape[-2]
    return t if extra == 0 else torch.nn.functional.pad(t, (0, 0, extra, 0))


def merge(cache: Any, mask: torch.Tensor, new_cache: Any, new_mask: torch.Tensor) -> torch.Tensor:
    """Append ``new_cache``'s rows to ``cache`` (in place), both left-padded to one length; returns the joint mask."""
    length = max(mask.shape[1], new_mask.shape[1])
    for layer, new in zip(_layers(cache) or [], _layers(new_cache) or [], strict=True):
        layer.keys = torch.cat([_left_pad(layer.keys, length), _left_pad(new.keys, length)], dim=0)
        layer.values = torch.cat([_left_pad(layer.values, length), _left_pad(new.values, length)], dim=0)

    def pad_mask(m: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pad(m, (length - m.shape[1], 0))

    return torch.cat([pad_mask(mask), pad_mask(new_mask)], dim=0)
