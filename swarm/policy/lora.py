"""LoRA plumbing for the ``hf`` backend: one peft adapter per policy on a shared base model.

Plain functions over a model: attach adapters (deterministic initialisation from a seed; lora_B
starts at zero, so a fresh adapter equals the base), read an adapter's state, load an adapter
state (peft's key format, as ``get_peft_model_state_dict`` returns it), or load a (partial) full
state dict into the base weights underneath the adapters. No locking or versioning here: the
backend does that.
"""

from __future__ import annotations

import torch

from swarm.errors import ValidationError
from swarm.lora import LoraSpec
from swarm.policy.base import StateDict

__all__ = ["attach_adapters", "get_adapter_state", "load_adapter_state", "load_base_state"]


def attach_adapters(base: torch.nn.Module, specs: dict[str, LoraSpec]) -> torch.nn.Module:
    """Wrap ``base`` in a peft model with one adapter per ``adapter name -> LoraSpec``; ``base`` if none.

    lora_A is initialised from seed 0 without touching the caller's RNG (lora_B starts at zero)."""
    if not specs:
        return base
    from peft import get_peft_model

    model = None
    for name, spec in specs.items():
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            if model is None:
                model = get_peft_model(base, spec.peft(), adapter_name=name)
            else:
                model.add_adapter(name, spec.peft())
    return model


def get_adapter_state(model: torch.nn.Module, name: str) -> StateDict:
    """A detached copy of adapter ``name``'s weights, keys without the adapter name."""
    from peft import get_peft_model_state_dict

    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(model, adapter_name=name).items()}


def load_adapter_state(model: torch.nn.Module, name: str, state: StateDict) -> None:
    """Copy ``state`` (peft keys) into adapter ``name``; unknown LoRA keys are an error."""
    from peft import set_peft_model_state_dict

    res = set_peft_model_state_dict(model, state, adapter_name=name)
    bad = [k for k in getattr(res, "unexpected_keys", []) if "lora_" in k]
    if bad:
        raise ValidationError(f"adapter_state: unexpected keys {bad[:3]}")


def load_base_state(base_model: torch.nn.Module, state: StateDict) -> None:
    """Copy a (partial) plain model state dict into the base weights, under any LoRA wrappers."""
    own = base_model.state_dict()
    mapped = {}
    for key, value in state.items():
        cands = [key, key.removeprefix("base_model.model.")]
        cands += [c.rsplit(".", 1)[0] + ".base_layer." + c.rsplit(".", 1)[1] for c in list(cands) if "." in c]
        hit = next((c for c in cands if c in own), None)
        if hit is None:
            raise ValidationError(f"adapter_state: unknown weight {key!r}")
        if tuple(own[hit].shape) != tuple(value.shape):
            raise ValidationError(
                f"adapter_state: {key!r} has shape {tuple(value.shape)}, expected {tuple(own[hit].shape)}"
            )
        mapped[hit] = value
    base_model.load_state_dict(mapped, strict=False)
