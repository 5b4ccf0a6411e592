"""A sampling copy of the model with one policy's LoRA merged into its weights, so a decode step pays no adapter cost.

peft applies an unmerged LoRA as two extra matmuls (and a few more kernels) per adapted layer on
every forward; at decode time, where a step is one token per row, that overhead is most of a small
model's step on a GPU (issue 36: ~4x in eager decoding). A merged copy computes ``x @ (W + s B A)``
in one matmul instead. The copy shares every tensor with the live model except the adapted
layers' weights, which it owns (memory: one extra copy of those weights, e.g. the attention
projections under the default ``target_modules``). It is re-merged when the policy, its version or
the base weights change (:meth:`MergedCopy.model_for`), an ``O(adapted weights)`` add.

Sampling from it samples from the merged model's distribution, and that is the distribution the
recorded logprobs are taken from; the trainer's unmerged recompute differs by float rounding only
(float32 on CPU: ~1e-6, ``tests/policy/test_merged_lora.py``). Used only while a batch holds one
policy; a batch that mixes policies runs the peft model with per-row adapters (``_mixed.py``).
"""

from __future__ import annotations

import copy
from collections.abc import Hashable
from typing import Any

import torch

__all__ = ["MergedCopy"]


def _lora_layers(peft_model: Any) -> list[tuple[str, Any]]:
    """(module path inside the wrapped transformers model, peft LoRA layer) for every adapted layer."""
    from peft.tuners.lora import LoraLayer

    base = peft_model.get_base_model()
    return [(name, m) for name, m in base.named_modules() if isinstance(m, LoraLayer)]


class MergedCopy:
    """A plain transformers model sharing the live model's tensors, its adapted layers' weights merged per policy."""

    @staticmethod
    def unsupported(peft_model: Any) -> str | None:
        """Why this model's adapters cannot be merged into a copy (None when they can): plain LoRA on Linear only."""
        for name, layer in _lora_layers(peft_model):
            if layer.lora_variant or any(layer.lora_bias.values()) or not isinstance(layer.get_base_layer(),
                                                                                    torch.nn.Linear):
                return f"merged sampling supports plain LoRA on Linear layers only ({name})"
        return None

    def __init__(self, peft_model: Any) -> None:
        why = self.unsupported(peft_model)
        if why:
            raise ValueError(why)
        base = peft_model.get_base_model()
        layers = _lora_layers(peft_model)
        # every parameter and buffer shared (memo), then each LoRA wrapper replaced by a Linear owning its weight
        memo: dict[int, Any] = {id(t): t for t in [*base.parameters(), *base.buffers()]}
        self.model = copy.deepcopy(base, memo)
        self._pairs: list[tuple[Any, torch.nn.Linear]] = []
        for name, layer in layers:
            src = layer.get_base_layer()
            lin = torch.nn.Linear(src.in_features, src.out_features, bias=False, device="meta")
            lin.weight = torch.nn.Parameter(src.weight.detach().clone(), requires_grad=False)
            lin.bias = src.bias  # shared, unchanged by LoRA
            parent_name, _, child = name.rpartition(".")
            setattr(self.model.get_submodule(parent_name) if parent_name else self.model, child, lin)
            self._pairs.append((layer, lin))
        self.model.eval()
        self.model.requires_grad_(False)
        self._key: Hashable | None = None

    @torch.inference_mode()  # the copy's tensors are inference tensors (built inside the decode loop)
    def model_for(self, adapter: str | None, key: Hashable) -> Any:
        """The copy with ``adapter``'s LoRA merged (None: the base weights); re-merged only when ``key`` changed."""
        if key != self._key:
            for layer, lin in self._pairs:
                lin.weight.copy_(layer.get_base_layer().weight)
                if adapter is not None and adapter in layer.lora_A:
                    lin.weight.add_(layer.get_delta_weight(adapter).to(lin.weight.dtype))
            self._key = key
        return self.model

    def invalidate(self) -> None:
        """Forget the merged state: the live weights changed (a trainer's in-place update, a base-weights load)."""
        self._key = None
