"""PolicyRouter: one gateway backend over several backends, each serving its own policies.

A run may train policies on one base (hf or vllm) and serve others from different bases next to
them: a frozen opponent on a bigger or smaller model, a judge behind an OpenAI-compatible
``upstream`` server. The router maps each policy name to the backend that serves it;
everything that takes a ``policy`` (``generate``, ``stream``, ``version``, ``max_context``,
``render_chat``, ``encode``, ``decode``, ``load_weights``, tool parsers, constraints) goes to that
backend. Policies named ``frozen`` are never trained: ``load_weights`` refuses them.

What has no policy argument is answered honestly:

* ``tokenizer`` is the *primary* backend's (the first one: the trained base in ``flows.train``),
  the one whose ids the trainer's policies use. When the trainable (non-frozen) policies sit on
  backends that tokenize differently there is no single answer, and it raises
  :class:`~swarm.errors.BackendError` (use ``encode`` / ``decode`` with a policy instead).
* ``supports_constraints`` / ``max_top_logprobs`` say what *some* policy can do, so the gateway
  lets such requests through; a request routed to a backend that cannot honour them is refused
  there with a :class:`~swarm.errors.ValidationError` naming the parameter.

It does not replicate a policy across backends (that is :class:`~swarm.policy.fleet.FleetBackend`),
start or health-check backends, or record anything.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

from swarm.errors import BackendError, NotFoundError, ValidationError
from swarm.policy.base import GenerateRequest, Generation, PolicyBackend, StateDict, TokenDelta
from swarm.policy.base import vocab_size as _vocab_size

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from swarm.policy.constraint import Constraint
    from swarm.policy.toolcalls import ToolParser

__all__ = ["PolicyRouter"]

_PROBE = "Router probe: hello, world 123 <|im_end|>"


class PolicyRouter:
    """A PolicyBackend routing each request to the backend serving its policy (see the module docstring)."""

    def __init__(self, backends: Sequence[PolicyBackend], frozen: Iterable[str] = ()) -> None:
        if not backends:
            raise ValidationError("PolicyRouter needs at least one backend", field="backends")
        self._backends = list(backends)
        self._routes: dict[str, PolicyBackend] = {}
        for b in self._backends:
            for p in b.policies():
                if p in self._routes:
                    raise ValidationError(f"policy {p!r} is served by two backends "
                                          f"({type(self._routes[p]).__name__} and {type(b).__name__})", policy=p)
                self._routes[p] = b
        self._frozen = frozenset(frozen)
        unknown = sorted(self._frozen - set(self._routes))
        if unknown:
            raise ValidationError(f"frozen policies {unknown} are served by no backend; served: {sorted(self._routes)}",
                                  field="frozen")

    # -- routing ------------------------------------------------------------------------------
    def backend_for(self, policy: str) -> PolicyBackend:
        """The backend serving ``policy`` (NotFoundError naming the served ones otherwise)."""
        try:
            return self._routes[policy]
        except KeyError:
            raise NotFoundError(f"unknown policy {policy!r}; served: {sorted(self._routes)}", policy=policy) from None

    @property
    def backends(self) -> list[PolicyBackend]:
        return list(self._backends)

    @property
    def frozen(self) -> frozenset[str]:
        """Policies served as they are: never trained, ``load_weights`` refuses them."""
        return self._frozen

    def trainable(self) -> list[str]:
        """The served policies that are not frozen."""
        return [p for p in self._routes if p not in self._frozen]

    # -- PolicyBackend: metadata --------------------------------------------------------------
    def policies(self) -> list[str]:
        return list(self._routes)

    def version(self, policy: str) -> int:
        return self.backend_for(policy).version(policy)

    def max_context(self, policy: str) -> int:
        return self.backend_for(policy).max_context(policy)

    def vocab_size(self, policy: str) -> int:
        """The vocabulary of ``policy``'s model; BackendError when its backend has no local tokenizer."""
        n = _vocab_size(self.backend_for(policy), policy)
        if n is None:
            raise BackendError(f"policy {policy!r}: its backend has no known vocabulary", policy=policy)
        return n

    @property
    def supports_constraints(self) -> bool:
        """True when some policy's backend enforces structured outputs (others refuse per request)."""
        return any(getattr(b, "supports_constraints", False) for b in self._backends)

    @property
    def max_top_logprobs(self) -> int:
        """The most alternatives any policy reports (a request beyond its own backend's is refused)."""
        return max(int(getattr(b, "max_top_logprobs", 0)) for b in self._backends)

    def tool_call_markers(self, policy: str) -> tuple[str, ...]:
        own = getattr(self.backend_for(policy), "tool_call_markers", None)
        return tuple(own(policy)) if callable(own) else ()

    def tool_parser(self, policy: str) -> ToolParser | None:
        get = getattr(self.backend_for(policy), "tool_parser", None)
        return get(policy) if callable(get) else get

    def forwards_openai_fields(self, policy: str) -> bool:
        forwards = getattr(self.backend_for(policy), "forwards_openai_fields", None)
        return bool(forwards(policy)) if callable(forwards) else False

    def exact_tokens(self, policy: str) -> bool:
        exact = getattr(self.backend_for(policy), "exact_tokens", None)
        return True if exact is None else bool(exact(policy))

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase | None:
        """The primary (first) backend's tokenizer; BackendError when trainable policies tokenize differently."""
        trained = {id(self._routes[p]): self._routes[p] for p in self.trainable()}
        if len(trained) > 1:
            seen = set()
            for b in trained.values():
                try:
                    seen.add(tuple(b.encode(b.policies()[0], _PROBE)))
                except Exception:  # no local tokenizer: cannot tell, so no single answer either
                    seen.add(None)
            if len(seen) > 1:
                raise BackendError("the router's trainable policies are served by backends with different "
                                   "tokenizers: there is no single tokenizer; use encode/decode(policy, ...)")
        return getattr(self._backends[0], "tokenizer", None)

    # -- PolicyBackend: text <-> ids ----------------------------------------------------------
    def render_chat(self, policy: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                    add_generation_prompt: bool) -> str:
        return self.backend_for(policy).render_chat(policy, messages, tools, add_generation_prompt)

    def encode(self, policy: str, text: str) -> list[int]:
        return self.backend_for(policy).encode(policy, text)

    def decode(self, policy: str, ids: list[int]) -> str:
        return self.backend_for(policy).decode(policy, ids)

    # -- PolicyBackend: generation ------------------------------------------------------------
    def _check_request(self, request: GenerateRequest) -> PolicyBackend:
        backend = self.backend_for(request.policy)
        c = request.constraint
        if c is not None and not getattr(backend, "supports_constraints", False):
            raise ValidationError(f"{c.param}: policy {request.policy!r} is served by a {type(backend).__name__}, "
                                  "which cannot enforce structured outputs", param=c.param, policy=request.policy)
        k = request.sampling.top_logprobs
        cap = int(getattr(backend, "max_top_logprobs", 0))
        if k > cap:
            raise ValidationError(f"top_logprobs is {k}; policy {request.policy!r} reports at most {cap} "
                                  "alternatives per token", param="top_logprobs", policy=request.policy)
        return backend

    def compile_constraint(self, policy: str, constraint: Constraint) -> None:
        """Compile on the policy's backend (refused there if it cannot enforce constraints)."""
        self._check_request(GenerateRequest(policy=policy, constraint=constraint))
        compile_ = getattr(self.backend_for(policy), "compile_constraint", None)
        if callable(compile_):
            compile_(policy, constraint)

    async def generate(self, request: GenerateRequest) -> list[Generation]:
        return await self._check_request(request).generate(request)

    async def stream(self, request: GenerateRequest) -> AsyncIterator[TokenDelta | Generation]:
        backend = self._check_request(request)
        async with aclosing(backend.stream(request)) as items:  # a client that hangs up stops the sampling
            async for item in items:
                yield item

    # -- publishing ---------------------------------------------------------------------------
    def load_weights(self, policy: str, adapter_state: StateDict | None, version: int) -> None:
        """Publish to the policy's backend; a frozen policy refuses (ValidationError, a ValueError)."""
        backend = self.backend_for(policy)
        if policy in self._frozen:
            raise ValidationError(f"policy {policy!r} is frozen (frozen_policies): it is served as it is and "
                                  "never takes new weights", policy=policy)
        backend.load_weights(policy, adapter_state, version)

    # -- lifecycle ----------------------------------------------------------------------------
    def close(self) -> None:
        for b in self._backends:
            close = getattr(b, "close", None)
            if callable(close):
                close()

    async def aclose(self) -> None:
        """Each member's ``aclose``: the connections the running event loop holds (the members stay open)."""
        for b in self._backends:
            aclose = getattr(b, "aclose", None)
            if callable(aclose):
                await aclose()
