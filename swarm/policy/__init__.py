"""Inference backends behind one interface, and the tiny offline model builder.

``build_backend(kind, **kwargs)`` makes a backend by name: ``hf`` (:class:`HFBackend`,
transformers in-process), ``vllm`` (:class:`VLLMBackend`, a ``vllm serve`` process over HTTP),
``upstream`` (:class:`UpstreamBackend`, any OpenAI-compatible server) or ``echo`` (the gateway's
null backend). Backend classes are imported lazily, so importing this package does not import
torch. Nothing here records steps: that is the gateway's job.
"""

from __future__ import annotations

import importlib
from typing import Any

from swarm.policy.base import GenerateRequest, Generation, PolicyBackend, SamplingParams, TokenDelta

__all__ = ["PolicyBackend", "GenerateRequest", "SamplingParams", "Generation", "TokenDelta", "HFBackend",
           "UpstreamBackend", "VLLMBackend", "ensure_tiny_model", "build_backend", "BACKENDS"]

# kind -> (module, class)
BACKENDS: dict[str, tuple[str, str]] = {
    "hf": ("swarm.policy.hf", "HFBackend"),
    "upstream": ("swarm.policy.upstream", "UpstreamBackend"),
    "vllm": ("swarm.policy.vllm", "VLLMBackend"),
    "echo": ("swarm.policy.echo", "EchoBackend"),
}
_LAZY = {cls: mod for mod, cls in BACKENDS.values()} | {"ensure_tiny_model": "swarm.policy.tiny"}


def build_backend(kind: str, **kwargs: Any) -> PolicyBackend:
    """Construct the backend named ``kind`` with ``kwargs`` (its constructor's arguments)."""
    from swarm.errors import ValidationError

    if kind not in BACKENDS:
        raise ValidationError(f"backend kind {kind!r} is unknown; choose one of {sorted(BACKENDS)}", kind=kind)
    module, cls = BACKENDS[kind]
    return getattr(importlib.import_module(module), cls)(**kwargs)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'swarm.policy' has no attribute {name!r}")
