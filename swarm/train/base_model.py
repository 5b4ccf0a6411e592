"""The trainer's base model: loaded once, frozen, in the configured dtype, shared by every policy.

A run that trains several policies (one per Werewolves role, say) used to give each
:class:`~swarm.train.Trainer` its own fp32 copy of the base: four roles on a 14B base need
~224 GB before activations. Here :class:`SharedBase` loads the base once (``dtype``: float32,
bfloat16 or float16), freezes it, and attaches one peft LoRA adapter per policy to that single
copy. Adapter weights are kept in float32 whatever the base dtype (so the optimizer state is
float32 too); peft runs the LoRA path in the adapter's dtype and casts its output back.

:meth:`SharedBase.view` hands a trainer a :class:`PolicyAdapter`: the small part of the model
interface the trainer uses (``parameters``, ``named_parameters``, ``train``, ``get_base_model``,
``disable_adapter``, ``save_pretrained``, ``adapter_state``), restricted to that policy's adapter.
A view makes its adapter the active one before every forward (``train`` / ``get_base_model``),
so trainers that take turns on the shared model each train only their own weights.

Not here: full fine-tuning (each policy then owns all its weights; load one fp32 model per
policy), concurrent updates of two policies on one base (the flow runs them one after another),
sharing the trainer's base with the serving backend's.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from swarm.errors import ValidationError
from swarm.train.tree_attention import install_tree_attention

__all__ = ["DTYPES", "load_base_model", "SharedBase", "PolicyAdapter", "policy_models"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValidationError(f"model.dtype: must be one of {sorted(DTYPES)}, got {name!r}")
    return DTYPES[name]


def load_base_model(path: str | Path, dtype: str = "float32", device: str | torch.device = "cpu",
                    gradient_checkpointing: bool = False, attn_implementation: str | None = None) -> Any:
    """A local causal LM in ``dtype`` on ``device``, all weights frozen; optional gradient checkpointing.

    Checkpointing recomputes each decoder layer in the backward pass instead of keeping its
    activations (non-reentrant, so a frozen base with trainable adapters needs no input grads).
    """
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"dtype": _dtype(dtype)}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    model = AutoModelForCausalLM.from_pretrained(str(path), **kwargs).to(device)
    model.requires_grad_(False)
    model.config.use_cache = False
    if gradient_checkpointing:
        model.activation_checkpointing_enable({"use_reentrant": False})
        install_tree_attention(model)  # the recompute must see the same tree attention as the forward
    return model


class SharedBase:
    """One frozen base with one float32 LoRA adapter per policy (see the module docstring).

    ``lora``: a :class:`~swarm.train.LoraSpec`. Adapter ``i`` is initialised from ``seed + i``'s
    RNG stream without touching the caller's RNG; lora_B starts at zero, so each adapter starts
    equal to the base.
    """

    def __init__(self, base: Any, lora: Any, policies: list[str], seed: int = 0) -> None:
        from peft import get_peft_model

        if not policies:
            raise ValidationError("policies: at least one policy name is required")
        # peft adapter names become module keys: policy names may hold dots or clash with "lora_"
        self.adapters = {p: f"policy{i}" for i, p in enumerate(policies)}
        model = None
        for i, p in enumerate(policies):
            lc = lora.peft()
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed + i)
                if model is None:
                    model = get_peft_model(base, lc, adapter_name=self.adapters[p], autocast_adapter_dtype=False)
                else:
                    model.add_adapter(self.adapters[p], lc, autocast_adapter_dtype=False)
        assert model is not None
        self.model = model
        self.params: dict[str, dict[str, torch.nn.Parameter]] = {p: {} for p in policies}
        for name, param in model.named_parameters():
            owner = next((p for p, a in self.adapters.items() if f".{a}." in name), None)
            if owner is None:
                param.requires_grad_(False)
                continue
            # fp32 adapters (and so fp32 optimizer state) over a bf16/fp16 base
            param.data = param.data.to(torch.float32)
            param.requires_grad_(True)
            self.params[owner][name] = param
        self._active: str | None = None
        self._lock = threading.Lock()

    def activate(self, policy: str) -> None:
        """Route the shared model's LoRA layers to ``policy``'s adapter; every adapter stays trainable."""
        with self._lock:
            if self._active == policy:
                return
            self.model.set_adapter(self.adapters[policy])
            for param in (q for ps in self.params.values() for q in ps.values()):
                param.requires_grad_(True)  # set_adapter freezes the others; their optimizers own them
            self._active = policy

    def view(self, policy: str) -> PolicyAdapter:
        """The model a policy's Trainer trains: this base with ``policy``'s adapter."""
        if policy not in self.adapters:
            raise ValidationError(f"unknown policy {policy!r}; the shared base has {sorted(self.adapters)}")
        return PolicyAdapter(self, policy)


class PolicyAdapter:
    """One policy's view of a :class:`SharedBase`: what :class:`~swarm.train.Trainer` needs of a model."""

    def __init__(self, shared: SharedBase, policy: str) -> None:
        self.shared = shared
        self.policy = policy
        self.adapter_name = shared.adapters[policy]
        self.peft_config = {self.adapter_name: shared.model.peft_config[self.adapter_name]}

    # -- the trainable weights: this policy's adapter only --
    def named_parameters(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        """This policy's adapter parameters, with their names in the shared model."""
        yield from self.shared.params[self.policy].items()

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        """This policy's adapter parameters."""
        yield from self.shared.params[self.policy].values()

    # -- what the flow reads of any causal LM --
    @property
    def config(self) -> Any:
        """The shared model's Hugging Face config (vocabulary, positions)."""
        return self.shared.model.config

    def get_input_embeddings(self) -> torch.nn.Module:
        """The shared input embedding table (its size is the vocabulary the steps must fit)."""
        return self.shared.model.get_input_embeddings()

    # -- running the model --
    def get_base_model(self) -> Any:
        """The shared ``*ForCausalLM`` (LoRA layers inside), routed to this policy's adapter."""
        self.shared.activate(self.policy)
        return self.shared.model.get_base_model()

    def train(self, mode: bool = True) -> PolicyAdapter:
        """Training mode on the shared model, with this policy's adapter active."""
        self.shared.activate(self.policy)
        self.shared.model.train(mode)
        return self

    def eval(self) -> PolicyAdapter:
        """Eval mode on the shared model."""
        return self.train(False)

    def to(self, device: str | torch.device) -> PolicyAdapter:
        """Move the shared model (every policy's adapters with it)."""
        self.shared.model.to(device)
        return self

    @contextlib.contextmanager
    def disable_adapter(self) -> Iterator[None]:
        """The frozen base alone (the KL reference)."""
        with self.shared.model.disable_adapter():
            yield

    # -- publishing --
    def adapter_state(self) -> dict[str, torch.Tensor]:
        """Detached CPU copies of this adapter in peft's key format (no adapter name in the keys)."""
        from peft import get_peft_model_state_dict

        state = get_peft_model_state_dict(self.shared.model, adapter_name=self.adapter_name)
        return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}

    def save_pretrained(self, directory: str | Path) -> None:
        """peft's on-disk format for this adapter: ``adapter_config.json`` + ``adapter_model.safetensors``."""
        from safetensors.torch import save_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        cfg = self.peft_config[self.adapter_name]
        cfg.save_pretrained(str(directory))
        save_file({k: v.contiguous() for k, v in self.adapter_state().items()},
                  str(directory / "adapter_model.safetensors"), metadata={"format": "pt"})


def policy_models(path: str | Path, lora: Any, policies: list[str], dtype: str = "float32",
                  device: str | torch.device = "cpu", gradient_checkpointing: bool = False) -> dict[str, Any]:
    """``policy -> model`` for each policy's Trainer.

    With ``lora``: views of one :class:`SharedBase` loaded in ``dtype``. Without (full
    fine-tuning): one float32 copy per policy, since every weight is trained and needs float32
    master weights and optimizer state whatever ``dtype`` the server uses.
    """
    if lora is None:
        return {p: load_base_model(path, "float32", device, gradient_checkpointing).requires_grad_(True)
                for p in policies}
    shared = SharedBase(load_base_model(path, dtype, device, gradient_checkpointing), lora, list(policies))
    return {p: shared.view(p) for p in policies}
