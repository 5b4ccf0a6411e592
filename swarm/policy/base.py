"""The one interface every inference backend implements (hf, vllm, upstream, echo).

A backend serves one or more named policies. It turns chat messages (or raw prompt ids) into a
:class:`Generation`: the exact prompt ids it consumed, the exact response ids it sampled and
their logprobs under the distribution it actually sampled from, the decoded text, parsed tool
calls and the finish reason. It does not store anything: recording steps is the gateway's job.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from swarm.policy.constraint import Constraint

from swarm.errors import SwarmError

__all__ = ["SamplingParams", "GenerateRequest", "Generation", "TokenDelta", "coalesced", "PolicyBackend", "VersionTable",
           "vocab_size", "CLIENT_BODY", "StateDict"]

StateDict = dict[str, "torch.Tensor"]  # weights by parameter name: a peft adapter's, or a (partial) model's

CLIENT_BODY = "body"  # GenerateRequest.client_fields key: the client's chat body as sent (the fields it set)


@dataclass(frozen=True)
class SamplingParams:
    """How to sample; ``max_tokens`` bounds the response, ``n`` the number of samples.

    ``top_k``: keep only the ``top_k`` most likely tokens (before ``top_p``); 0 turns it off.
    """

    max_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    n: int = 1
    top_logprobs: int = 0  # also report this many most likely tokens per position (of the sampled distribution)
    top_k: int = 0  # 0: off


@dataclass
class GenerateRequest:
    """Either ``messages`` (+ ``tools``) rendered with the policy's chat template, or ``prompt_ids``.

    ``constraint``: what the reply must match (``swarm.policy.constraint``); a backend that cannot
    enforce it refuses the request (ValidationError naming the constraint's ``param``).
    ``client_fields``: OpenAI chat fields exactly as the client sent them (``tool_choice``,
    ``parallel_tool_calls``, ``response_format``, ``logprobs``), for a backend that forwards the call
    to a server which honours them itself (``upstream``); local backends act on ``constraint`` and
    ``sampling`` instead. Under :data:`CLIENT_BODY` the gateway also hands over the client's whole
    chat body as sent (the keys it set, content parts and unknown keys included, nothing filled in),
    which a forwarding backend sends on instead of rebuilding it from ``sampling``.
    """

    policy: str
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    prompt_ids: list[int] | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    constraint: Constraint | None = None
    client_fields: dict[str, Any] = field(default_factory=dict)


@dataclass
class Generation:
    """One sampled completion with the exact tokens and logprobs.

    ``constraint``: the record of the grammar it was sampled under (``Grammars.record``), which the
    step stores so the trainer can replay the masks; ``top_logprobs``: per position, the
    ``(token id, logprob)`` pairs asked for with ``SamplingParams.top_logprobs``.
    ``logprobs_content``: from a server that tokenizes for itself (``upstream``), its per-token
    entries as it sent them in OpenAI's ``logprobs.content`` shape (token text, logprob, bytes,
    ``top_logprobs``); the gateway passes them on to the client. ``logprobs`` (and so the step's
    ``response_logprobs``) stays None unless they line up with known ``response_ids``.
    ``usage``: the serving backend's own OpenAI ``usage`` for the whole call, when it reports one
    (``upstream``); the gateway answers with it instead of counting ids.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float] | None
    text: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str = "stop"
    policy_version: int = 0
    constraint: dict[str, Any] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None
    logprobs_content: list[dict[str, Any]] | None = None
    usage: dict[str, Any] | None = None


@dataclass
class TokenDelta:
    """A streamed piece of one completion: new token ids, their logprobs and the new text."""

    index: int
    token_ids: list[int]
    logprobs: list[float] | None
    text: str
    top_logprobs: list[list[tuple[int, float]]] | None = None
    logprobs_content: list[dict[str, Any]] | None = None  # as on Generation


def coalesced(deltas: list[TokenDelta]) -> list[TokenDelta]:
    """Each choice's deltas as one where they can join (the same kinds of logprobs, each list one entry per token id),
    in order of their choices' first.

    A streaming backend hands the gateway what one network read brought this way: a stream relayed by a busy gateway
    then costs a chunk per read, not per token, and every token, logprob and character is still sent once, in order.
    """
    out: list[TokenDelta] = []
    open_at: dict[int, int] = {}  # choice -> where in ``out`` its last delta is
    for d in deltas:
        k = open_at.get(d.index)
        last = out[k] if k is not None else None
        if last is not None and _per_token(last) and _per_token(d) and all(
                (getattr(last, f) is None) == (getattr(d, f) is None) for f in _JOINED):
            out[k] = TokenDelta(index=d.index, token_ids=last.token_ids + d.token_ids, text=last.text + d.text,
                                **{f: None if getattr(d, f) is None else getattr(last, f) + getattr(d, f)
                                   for f in _JOINED})
        else:
            open_at[d.index] = len(out)
            out.append(d)
    return out


_JOINED = ("logprobs", "top_logprobs", "logprobs_content")


def _per_token(d: TokenDelta) -> bool:
    """Each of its logprob lists holds one entry per token id: joined, they stay aligned with the ids."""
    return all(getattr(d, f) is None or len(getattr(d, f)) == len(d.token_ids) for f in _JOINED)


@runtime_checkable
class PolicyBackend(Protocol):
    """What the gateway and the trainer need from an inference backend."""

    def policies(self) -> list[str]:
        """Names of the policies this backend serves."""
        ...

    def version(self, policy: str) -> int:
        """The version of the weights a request for ``policy`` gets now."""
        ...

    def max_context(self, policy: str) -> int:
        """Maximum prompt + response tokens."""
        ...

    def render_chat(
        self, policy: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, add_generation_prompt: bool
    ) -> str:
        """The chat template applied to messages, as text (for prefix-consistent tokenization)."""
        ...

    def encode(self, policy: str, text: str) -> list[int]:
        """Tokenize text without adding special tokens."""
        ...

    def decode(self, policy: str, ids: list[int]) -> str:
        """Ids back to text, special tokens included."""
        ...

    async def generate(self, request: GenerateRequest) -> list[Generation]:
        """``request.sampling.n`` completions for one prompt."""
        ...

    def stream(self, request: GenerateRequest) -> AsyncIterator[TokenDelta | Generation]:
        """Yield :class:`TokenDelta` pieces as tokens are sampled, then the final :class:`Generation` per sample."""
        ...

    def load_weights(self, policy: str, adapter_state: StateDict | None, version: int) -> None:
        """Swap in new weights atomically between generations; requests after this get ``version``.
        ``None``: only the version changes (the weights already changed in place, or a follower's record
        has no adapter)."""
        ...


class VersionTable:
    """``policies`` / ``version`` over ``self._versions`` (policy -> served version), and the
    unknown-policy check, for backends that keep their versions in such a dict."""

    _versions: dict[str, int]

    def _check_policy(self, policy: str) -> None:
        if policy not in self._versions:
            from swarm.errors import NotFoundError

            raise NotFoundError(f"unknown policy {policy!r}; served: {sorted(self._versions)}", policy=policy)

    def policies(self) -> list[str]:
        return list(self._versions)

    def version(self, policy: str) -> int:
        self._check_policy(policy)
        return self._versions[policy]


def vocab_size(backend: PolicyBackend, policy: str) -> int | None:
    """How many token ids ``policy``'s model takes (valid ids are below it); None when unknown.

    Optional part of the protocol: a backend's own ``vocab_size(policy)``, else the size of its
    ``tokenizer``; a policy the backend does not serve has no known vocabulary.
    """
    try:
        if policy not in backend.policies():
            return None
        fn = getattr(backend, "vocab_size", None)
        if fn is not None:
            return int(fn(policy))
        tok = getattr(backend, "tokenizer", None)
        return None if tok is None else len(tok)
    except SwarmError:  # a backend without a local tokenizer (upstream): unknown, not an error
        return None
