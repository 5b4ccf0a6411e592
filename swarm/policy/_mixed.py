"""Which weights a decode step runs with: one policy's adapter, or peft's per-row adapters when policies share a batch.

A batch of one policy runs as before: its adapter made active (``set_adapter``), or adapters
disabled for a base-weights policy, once for as long as the batch stays that policy. When rows of
several policies share the batch (continuous batching admits any policy), each forward passes
peft's ``adapter_names`` (one per row; ``"__base__"`` for base weights), which applies every LoRA
to its own rows only. That path splits each LoRA layer's input by adapter in Python, so it is used
only while the batch mixes. With a merged sampling copy (``_merged.py``), a batch of one policy runs
that copy instead of the peft model. Entered and left around every forward; knows nothing of queues or
sampling.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

__all__ = ["StepWeights"]

BASE = "__base__"  # peft's name for "no adapter" in adapter_names


class StepWeights:
    """``forward(policies)``: the model and forward kwargs for rows of these policies, in the matching adapter state."""

    def __init__(self, model: Any, single: Callable[[str], contextlib.AbstractContextManager],
                 adapter_of: Callable[[str], str | None], peft: bool,
                 merged: Callable[[str], Any] | None = None) -> None:
        self._model = model  # the live (peft) model
        self._single = single  # the context that runs one policy's weights
        self._adapter_of = adapter_of  # a policy's peft adapter name, None for base weights
        self._peft = peft
        self._merged = merged  # a policy -> its merged sampling copy, when merging is on
        self._stack = contextlib.ExitStack()
        self._policies: frozenset[str] | None = None

    def forward(self, policies: list[str]) -> tuple[Any, dict[str, Any]]:
        """Enter the state for a forward over rows of ``policies`` (one per row); returns (model, extra kwargs)."""
        distinct = frozenset(policies)
        if len(distinct) == 1 and self._merged is not None:
            return self._merged(next(iter(distinct))), {}
        if distinct != self._policies:
            self._stack.close()  # leaves disable_adapter(): adapters are enabled again
            self._stack = contextlib.ExitStack()
            if len(distinct) == 1:
                self._stack.enter_context(self._single(next(iter(distinct))))
            self._policies = distinct
        if len(distinct) == 1 or not self._peft:
            return self._model, {}
        return self._model, {"adapter_names": [self._adapter_of(p) or BASE for p in policies]}

    def close(self) -> None:
        """Leave the current adapter state (at the end of the batch)."""
        self._stack.close()
        self._policies = None
