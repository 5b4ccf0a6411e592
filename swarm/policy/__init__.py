"""Inference backends behind one interface, and the tiny offline model builder.

``build_backend(kind, **kwargs)`` makes a backend by its declared kind (:data:`BACKENDS`, one
module each: swarm/policy/settings.py): ``hf`` (:class:`HFBackend`, transformers in-process), ``vllm``
(:class:`VLLMBackend`, a ``vllm serve`` process over HTTP), ``upstream`` (:class:`UpstreamBackend`,
any OpenAI-compatible server), ``echo`` (the gateway's null backend) or ``fleet`` (replicas). Backend classes are imported lazily, so importing this package does not import
torch. Nothing here records steps: that is the gateway's job.
"""

from __future__ import annotations

import importlib
from typing import Any

from swarm.policy.base import GenerateRequest, Generation, PolicyBackend, SamplingParams, TokenDelta
from swarm.policy.settings import BACKENDS

__all__ = ["PolicyBackend", "GenerateRequest", "SamplingParams", "Generation", "TokenDelta", "HFBackend",
           "UpstreamBackend", "VLLMBackend", "ensure_tiny_model", "build_backend", "BACKENDS"]


_LAZY = {"HFBackend": "swarm.policy.hf", "UpstreamBackend": "swarm.policy.upstream", "VLLMBackend": "swarm.policy.vllm",
         "EchoBackend": "swarm.policy.echo", "ensure_tiny_model": "swarm.policy.tiny"}


def build_backend(kind: str, **kwargs: Any) -> PolicyBackend:
    """Construct the backend class of the declared kind ``kind`` (:data:`BACKENDS`) with ``kwargs``, its
    constructor's arguments (a library user's shortcut; a config builds through the kind's section)."""
    target = BACKENDS.get(kind).target
    if target is None:
        from swarm.errors import ValidationError

        raise ValidationError(f"backend kind {kind!r} declares no backend class", kind=kind)
    return target(**kwargs)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'swarm.policy' has no attribute {name!r}")
