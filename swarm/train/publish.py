"""Save trained weights in peft format and hand them to a policy backend.

:func:`adapter_state` is what a backend's ``load_weights(policy, adapter_state, version)``
receives: for a LoRA model, peft's ``get_peft_model_state_dict`` (adapter keys without the
adapter name, loadable with ``set_peft_model_state_dict``); for a full fine-tune, the model's
whole ``state_dict``. Tensors are detached CPU clones, so later training cannot change a
published version. :func:`save_adapter` writes ``save_pretrained`` output (``adapter_config.json``
+ ``adapter_model.safetensors``, what transformers, peft and vLLM's ``--lora-modules`` /
``/v1/load_lora_adapter`` load) atomically: a temp dir renamed into place.
Does not bump versions: the trainer owns the version counter.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

__all__ = ["adapter_state", "save_adapter", "is_peft"]


def is_peft(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Detached CPU copies of the trained weights (adapter only for peft models)."""
    own = getattr(model, "adapter_state", None)
    if callable(own):  # one policy's adapter on a shared base (swarm.train.base_model)
        return own()
    if is_peft(model):
        from peft import get_peft_model_state_dict

        state = get_peft_model_state_dict(model)
    else:
        state = model.state_dict()
    return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}


def save_adapter(model: torch.nn.Module, directory: str | Path, **metadata: Any) -> Path:
    """``save_pretrained`` into ``directory`` atomically; an existing directory is replaced."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        model.save_pretrained(str(tmp))
        if metadata:
            import json

            (tmp / "swarm_version.json").write_text(json.dumps(metadata, sort_keys=True))
        if directory.exists():
            old = directory.with_name(f".{directory.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.rename(directory, old)
            os.rename(tmp, directory)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, directory)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return directory
