"""A static KV cache of fixed slots, for a decode step whose shapes never change (CUDA graphs).

``SlotCache`` holds, per layer, keys and values of shape ``[slots, kv_heads, length, head_dim]``,
allocated once. Every row of the running batch owns one slot; all slots write the new token's
key and value at one shared column (``col``), and a boolean ``valid[slot, column]`` says which
columns each slot attends to, so rows of different lengths coexist (a row's prompt sits
right-aligned before the column where it joined). A free slot attends only to the current column
(its output is ignored). When the write column reaches the end, :meth:`compact` shifts every
slot left by the columns no slot uses.

The model sees a 4D additive attention mask (:meth:`step_mask`), which transformers passes through
unchanged, and calls :meth:`update` as it would on its own caches (any ``Cache`` subclass is
accepted; only ``update`` and ``get_seq_length`` are used while the caller supplies position ids and
the mask). Pure tensor state; no model calls, no sampling.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache

__all__ = ["SlotCache", "static_supported"]


def static_supported(config: Any, attn_implementation: str | None = None) -> str | None:
    """Why ``config``'s model cannot decode on slots (None when it can): full attention in every layer, and an
    attention kernel that takes a 4D additive mask (sdpa or eager; flash and flex kernels read masks otherwise)."""
    if attn_implementation not in (None, "sdpa", "eager"):
        return f"attn_implementation={attn_implementation}: slots need sdpa or eager (a 4D additive mask)"
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    kinds = set(getattr(text, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"} or getattr(text, "sliding_window", None) and getattr(text, "use_sliding_window", True):
        return f"layer types {sorted(kinds)} / sliding window: only full-attention layers decode on slots"
    return None


class SlotCache(Cache):
    """``slots`` rows x ``length`` columns of keys and values per layer, written at one shared column."""

    is_compileable = True

    def __init__(self, config: Any, slots: int, length: int, dtype: torch.dtype, device: torch.device) -> None:
        from transformers.cache_utils import StaticLayer

        text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        # transformers' layers describe the cache to the model's mask code (full attention, not sliding);
        # they hold no tensors: update() writes our own
        heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        super().__init__(layers=[StaticLayer(max_cache_len=length) for _ in range(text.num_hidden_layers)])
        self.slots, self.length, self.dtype, self.device = slots, length, dtype, device
        shape = (slots, heads, length, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(text.num_hidden_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(text.num_hidden_layers)]
        self.col = 0  # the column the next token is written at (python int; mirrored in _col for the graph)
        self._col = torch.zeros(1, dtype=torch.long, device=device)
        self.valid = torch.zeros((slots, length), dtype=torch.bool, device=device)
        self.compactions = 0  # how often the slots were shifted left (for tests and monitoring)
        if not torch.compiler.is_compiling():
            for t in [*self.keys, *self.values, self._col]:
                torch._dynamo.mark_static_address(t)

    # --------------------------------------------------------------- what the model calls
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Write one token per slot at the shared column; return the whole layer (the mask selects)."""
        self.keys[layer_idx].index_copy_(2, self._col, key_states)
        self.values[layer_idx].index_copy_(2, self._col, value_states)
        return self.keys[layer_idx], self.values[layer_idx]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """The write column (positions come from the caller's position ids)."""
        return self.col

    def get_max_cache_shape(self, layer_idx: int = 0) -> int:
        return self.length

    # --------------------------------------------------------------- what the decode loop calls
    def reset(self, start: int) -> None:
        """Free every slot and put the write column at ``start``."""
        self.valid.zero_()
        self.col = start

    def place(self, slot: int, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        """Put a prefilled row (per layer ``[kv_heads, p, head_dim]``) right-aligned before the write column."""
        p = keys[0].shape[-2]
        if p > self.col:
            raise ValueError(f"a {p}-token prompt does not fit before column {self.col}")
        for layer, (k, v) in enumerate(zip(keys, values, strict=True)):
            self.keys[layer][slot, :, self.col - p : self.col] = k
            self.values[layer][slot, :, self.col - p : self.col] = v
        self.valid[slot] = False
        self.valid[slot, self.col - p : self.col] = True

    def free(self, slot: int) -> None:
        """The slot's row left: it attends to nothing but the current column from now on."""
        self.valid[slot] = False

    def first_used(self) -> int:
        """The first column any slot attends to (``col`` when none does)."""
        used = self.valid.any(dim=0).nonzero()
        return int(used[0]) if len(used) else self.col

    def compact(self) -> int:
        """Shift every slot left by the leading columns no slot uses; returns the shift."""
        shift = self.first_used()
        if shift > 0:
            keep = self.length - shift
            for t in [*self.keys, *self.values]:
                t[:, :, :keep] = t[:, :, shift:].clone()
            self.valid[:, :keep] = self.valid[:, shift:].clone()
            self.valid[:, keep:] = False
            self.col -= shift
            self.compactions += 1
        return shift

    def step_mask(self, active: torch.Tensor) -> torch.Tensor:
        """Open the write column to the ``active`` slots' rows and return the step's additive mask
        ``[slots, 1, 1, length]`` (cache dtype); free slots attend to the write column only, so no row is empty."""
        self._col.fill_(self.col)
        self.valid[active, self.col] = True
        allowed = self.valid.clone()
        allowed[:, self.col] = True
        mask = torch.full((self.slots, 1, 1, self.length), torch.finfo(self.dtype).min, dtype=self.dtype,
                          device=self.device)
        return mask.masked_fill_(allowed[:, None, None, :], 0.0)
