"""The ``upstream`` backend: any OpenAI-compatible server (frozen opponents, judges, API models).

Chat requests go to ``/chat/completions`` over httpx (the transport is injectable, e.g.
``httpx.MockTransport`` in tests). When the caller hands over the client's whole body
(``client_fields["body"]``, :data:`CLIENT_BODY`: the OpenAI fields it set, as sent), that body is
forwarded as sent: no sampling default it did not choose (``temperature``, ``top_p``, ``n``),
``max_completion_tokens`` under its own name, ``stream_options``, content parts, its unknown
(``extra_body``) keys. The only additions, all for recording: ``model`` (the upstream's id),
``stream`` (how the gateway reads the answer), ``logprobs: true`` (unless ``logprobs: false``),
``stream_options.include_usage: true`` when streaming (so usage comes back), and ``max_tokens``
(this backend's cap) only when the client set no length limit; a limit above the cap is lowered
in the key the client used. Without the body (older callers), the body is built from
``sampling`` as before: the messages, tools, ``temperature``, ``top_p``, ``n``, ``seed``,
``stop``, ``max_tokens``, and the client's ``tool_choice``, ``parallel_tool_calls`` and
``response_format`` exactly as it sent them. Either way the server enforces those, the gateway
emulates none of them (``forwards_openai_fields``). ``extra_body`` is merged into every request.
The upstream's ``usage`` (body, or the streamed usage chunk) comes back on every
:class:`UpstreamGeneration` of the call.

What is recorded, honestly:

- text and tool calls as the server returns them;
- token ids only when the server returns them (``token_id:<n>`` token strings, or ``token_ids`` /
  ``prompt_token_ids`` fields as vLLM does); logprobs only from ``logprobs.content`` and only
  when they line up with such ids. Without ids the step's ids are empty and its logprobs
  ``None`` (fine for opponents and judges, not for training); the prompt ids are never our local
  tokenizer's guess of the server's tokens, so such steps are not prefix consistent.
- the server's ``logprobs.content`` entries (token text, logprob, bytes, ``top_logprobs``) are
  passed on to the client as sent (``Generation.logprobs_content``), only when the server sent
  them; they are not stored in the step (it has no field for alternatives, for any backend).
- ``tokenizer_path`` is optional. Without it the backend has no vocabulary: prompts are planned on
  a plain-text rendering of the messages and carry no ids; ``/v1/completions`` (token ids in,
  token ids out) is refused, and so it is with a tokenizer unless ``completions: true`` says the
  server shares that tokenizer's vocabulary.
- ``logprobs: false`` (a server that rejects them): a request asking ``logprobs`` or
  ``top_logprobs`` is refused with a 400 naming the parameter, not answered without them.

A ``response_format`` / ``tool_choice`` constraint is also recorded on the step, as enforced by
the server: the trainer cannot replay a server's own masks.

Errors are mapped without leaking the upstream's address or credentials: a request the upstream
rejects (400/422) is the caller's 400 with the upstream's reason, a rate limit stays 429, an
authentication failure or an unknown model is a 502 saying the gateway is misconfigured, other
failures a 502. The api key is read from the environment variable ``api_key_env`` (default
``SWARM_UPSTREAM_API_KEY``), so it never sits in a config file or the MLflow params.

It does not train: the version is always 0 and ``load_weights`` raises.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

from swarm.errors import BackendError, ContextLengthError, NotFoundError, SwarmError, ValidationError
from swarm.lora import LoraSpec
from swarm.policy._http import EngineClient, post_json, sse_reads, token_id
from swarm.policy._upstream_reply import aligned, chat_token_data, norm_tool_calls
from swarm.policy.base import CLIENT_BODY, GenerateRequest, Generation, StateDict, TokenDelta, coalesced
from swarm.policy.chat import LocalTokenizer
from swarm.policy.settings import BACKENDS, BackendSection
from swarm.settings import derive

__all__ = ["UpstreamBackend", "UpstreamGeneration", "DEFAULT_API_KEY_ENV", "CLIENT_BODY"]

DEFAULT_API_KEY_ENV = "SWARM_UPSTREAM_API_KEY"
_URL = re.compile(r"\b(?:https?|wss?)://\S+")
_FORWARDED = ("tool_choice", "parallel_tool_calls", "response_format")  # the client's, as sent
_OURS = ("model", "stream", "stream_options")  # set here, whatever the client's body says


@dataclass
class UpstreamGeneration(Generation):
    """A :class:`Generation` of this backend: ``usage`` is the upstream's for the whole call (None when it sent none)."""


class RateLimitError(BackendError):
    """The upstream rate-limited the gateway; the client may retry later."""

    status_code = 429
    error_type = "rate_limit_error"


def _check_stop(stop: Any, max_stop: int, policy: str) -> None:
    n = len(stop) if isinstance(stop, list | tuple) else 1 if stop else 0
    if n > max_stop:
        raise ValidationError(f"stop: the upstream model accepts at most {max_stop} stop strings, got {n}",
                              param="stop", policy=policy)


def _client_body(request: GenerateRequest, raw: dict[str, Any], max_tokens: int, max_stop: int) -> dict[str, Any]:
    """The client's chat body as sent, its length limit capped at ``max_tokens`` (added only when it set none)."""
    _check_stop(raw.get("stop"), max_stop, request.policy)
    body = {k: v for k, v in raw.items() if k not in _OURS}
    limits = [k for k in ("max_completion_tokens", "max_tokens") if raw.get(k) is not None]
    for k in limits:
        body[k] = min(int(raw[k]), max_tokens)
    if not limits:
        body["max_tokens"] = min(request.sampling.max_tokens, max_tokens)
    return body


def _sampling_body(request: GenerateRequest, max_tokens: int, max_stop: int) -> dict[str, Any]:
    s = request.sampling
    _check_stop(s.stop, max_stop, request.policy)
    body: dict[str, Any] = {"max_tokens": min(s.max_tokens, max_tokens), "temperature": s.temperature,
                            "top_p": s.top_p, "n": s.n}
    if s.stop:
        body["stop"] = list(s.stop)
    if s.seed is not None:
        body["seed"] = s.seed
    if s.top_k > 0:  # vLLM and SGLang take it as an extra field; only sent when the client asked for it
        body["top_k"] = s.top_k
    return body


def _usage(value: Any) -> dict[str, Any] | None:
    """The upstream's usage object as sent, when it is one (token counts, details included)."""
    return dict(value) if isinstance(value, dict) and value else None


class UpstreamBackend(LocalTokenizer):
    """Client of an OpenAI-compatible server implementing :class:`~swarm.policy.base.PolicyBackend`.

    ``policies``: names served (a list: each maps to ``model``, or to itself when ``model`` is
    None; or a dict ``name -> upstream model id``). ``extra_body`` is merged into every request
    (e.g. ``{"return_token_ids": True}`` for vLLM). ``logprobs=False`` for servers that reject it
(requests asking for logprobs are then refused); ``max_top_logprobs``: the most alternatives per
token the server reports (OpenAI: 20).
    ``max_tokens``: the most new tokens asked per call (a request asking more gets this many; the
    gateway's default would be the whole context). ``max_stop``: stop strings allowed (OpenAI: 4).
    ``api_key``: for programmatic use; configs name an environment variable (``api_key_env``).
    """

    supports_constraints = True  # passed on to the server (see _body)
    max_top_logprobs: int  # 0 when the server gives no logprobs

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        model: str | None = None,
        policies: list[str] | dict[str, str] = ("default",),
        transport: httpx.AsyncBaseTransport | None = None,
        timeout_s: float = 300.0,
        tokenizer_path: str | None = None,
        max_context: int = 32768,
        logprobs: bool = True,
        extra_body: dict[str, Any] | None = None,
        api_key_env: str | None = DEFAULT_API_KEY_ENV,
        max_tokens: int = 4096,
        max_stop: int = 4,
        completions: bool = False,
        tool_parser: str | None = None,
        max_top_logprobs: int = 20,
    ) -> None:
        self._models = dict(policies) if isinstance(policies, dict) else {p: model or p for p in policies}
        api_key = api_key or (os.environ.get(api_key_env) if api_key_env else None)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._api_key = api_key
        self._max_tokens = int(max_tokens)
        self._max_stop = int(max_stop)
        self._completions = bool(completions)
        del tool_parser  # the upstream parses its own tool calls (accepted so model configs stay uniform)
        self.base_url = base_url.rstrip("/")
        self._client = EngineClient(self.base_url, headers, timeout_s, transport)
        self._max_context = int(max_context)
        self._logprobs = bool(logprobs)
        self.max_top_logprobs = int(max_top_logprobs) if logprobs else 0
        self._extra = dict(extra_body or {})
        self.tokenizer = None
        if tokenizer_path:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)

    async def aclose(self) -> None:
        """Close the connections the running event loop holds (the gateway's lifespan, as its loop ends)."""
        await self._client.close_loop()

    def _model(self, policy: str) -> str:
        if policy not in self._models:
            raise NotFoundError(f"unknown policy {policy!r}; served: {sorted(self._models)}", policy=policy)
        return self._models[policy]

    def _tokenizer_for(self, policy: str) -> Any:
        self._model(policy)
        if self.tokenizer is None:
            raise BackendError("the upstream backend has no local tokenizer (pass tokenizer_path)", policy=policy)
        return self.tokenizer

    # without a tokenizer: a plain-text rendering (for the gateway's prefix planning) and no ids
    def render_chat(self, policy: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                    add_generation_prompt: bool) -> str:
        if self.tokenizer is not None:
            return super().render_chat(policy, messages, tools, add_generation_prompt)
        self._model(policy)
        head = json.dumps(tools, sort_keys=True, ensure_ascii=False) + "\n" if tools else ""
        turns = "".join(json.dumps(m, sort_keys=True, ensure_ascii=False) + "\n" for m in messages)
        return head + turns

    def encode(self, policy: str, text: str) -> list[int]:
        """Local ids (with a tokenizer); without one, none: the upstream tokenizes for itself."""
        if self.tokenizer is not None:
            return super().encode(policy, text)
        self._model(policy)
        return []

    def decode(self, policy: str, ids: list[int]) -> str:
        """Local text of ids (with a tokenizer); without one, ids cannot be read here."""
        if self.tokenizer is not None:
            return super().decode(policy, ids)
        self._model(policy)
        if ids:
            raise BackendError("the upstream backend has no local tokenizer to decode ids (pass tokenizer_path)",
                               policy=policy)
        return ""

    def exact_tokens(self, policy: str) -> bool:
        """False: ids recorded for this policy are the upstream's (when it returns any), never ours."""
        self._model(policy)
        return False

    def forwards_openai_fields(self, policy: str) -> bool:
        """True: ``tool_choice`` (``none`` included) and the like go to the server as sent; the gateway emulates nothing."""
        self._model(policy)
        return True

    # ----------------------------------------------------------------------------- protocol
    def policies(self) -> list[str]:
        return list(self._models)

    def version(self, policy: str) -> int:
        self._model(policy)
        return 0

    def max_context(self, policy: str) -> int:
        self._model(policy)
        return self._max_context

    def load_weights(self, policy: str, adapter_state: StateDict | None, version: int) -> None:
        raise BackendError("the upstream backend serves frozen weights; load_weights is not supported", policy=policy)

    def _logprob_fields(self, request: GenerateRequest) -> dict[str, Any]:
        """``logprobs`` / ``top_logprobs`` for a chat body; a request this server cannot answer is refused."""
        k = request.sampling.top_logprobs
        asked = "top_logprobs" if k > 0 else "logprobs" if request.client_fields.get("logprobs") else None
        if asked and not self._logprobs:
            raise ValidationError(f"{asked}: the upstream model of policy {request.policy!r} does not return "
                                  "logprobs (logprobs: false in its model config)", param=asked,
                                  policy=request.policy, code="unsupported_parameter")
        if k > self.max_top_logprobs:
            raise ValidationError(f"top_logprobs is {k}; the upstream model of policy {request.policy!r} reports at "
                                  f"most {self.max_top_logprobs} alternatives per token", param="top_logprobs",
                                  policy=request.policy, code="unsupported_parameter")
        if not self._logprobs:
            return {}
        return {"logprobs": True, **({"top_logprobs": k} if k > 0 else {})}

    def _body(self, request: GenerateRequest, stream: bool) -> tuple[str, dict[str, Any]]:
        raw = request.client_fields.get(CLIENT_BODY)
        if isinstance(raw, dict) and request.messages is not None:
            return "/chat/completions", self._forwarded(request, raw, stream)
        body: dict[str, Any] = {"model": self._model(request.policy),
                                **_sampling_body(request, self._max_tokens, self._max_stop), **self._extra}
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}  # usage comes back (OpenAI sends none otherwise)
        if request.messages is not None:
            body["messages"] = request.messages
            if request.tools:
                body["tools"] = request.tools
            body.update(self._logprob_fields(request))
            # the client's own fields, exactly as sent: the server enforces them
            body.update({k: request.client_fields[k] for k in _FORWARDED if k in request.client_fields})
            if request.constraint is not None:  # a caller that gave only the constraint: OpenAI's form of it
                for key, value in request.constraint.openai_fields().items():
                    body.setdefault(key, value)
            return "/chat/completions", body
        if request.prompt_ids is None:
            raise ValidationError("request needs messages or prompt_ids", policy=request.policy)
        if not self._completions:
            raise ValidationError(
                "/v1/completions takes token ids, and this policy's upstream model has its own vocabulary: "
                "use /v1/chat/completions (or set completions: true with the upstream's own tokenizer_path)",
                param="prompt", policy=request.policy, code="unsupported_endpoint")
        if request.sampling.top_logprobs > 0:
            raise ValidationError("logprobs: the upstream backend reads back alternatives per token on "
                                  "/v1/chat/completions only (top_logprobs); use logprobs: 0 here", param="logprobs",
                                  policy=request.policy, code="unsupported_parameter")
        body["prompt"] = list(request.prompt_ids)
        if self._logprobs:
            body["logprobs"] = 1
        if request.constraint is not None:
            fields = request.constraint.openai_fields()
            if "response_format" not in fields:
                raise ValidationError("tool_choice needs a chat request on the upstream backend", param="tool_choice")
            body.update(fields)  # /v1/completions + response_format: vLLM and SGLang accept it
        return "/completions", body

    def _forwarded(self, request: GenerateRequest, raw: dict[str, Any], stream: bool) -> dict[str, Any]:
        """The client's own body plus what recording needs (module docstring), never a sampling default."""
        body: dict[str, Any] = {"model": self._model(request.policy),
                                **_client_body(request, raw, self._max_tokens, self._max_stop)}
        if "messages" not in body:
            body["messages"] = request.messages
        body.update(self._logprob_fields(request))
        if request.constraint is not None:  # a caller that gave only the constraint: OpenAI's form of it
            for key, value in request.constraint.openai_fields().items():
                body.setdefault(key, value)
        body.update(self._extra)
        if stream:
            sent = raw.get("stream_options")
            body["stream"] = True
            body["stream_options"] = {**(sent if isinstance(sent, dict) else {}), "include_usage": True}
        return body

    def _error(self, exc: SwarmError, policy: str) -> SwarmError:
        """The upstream's failure as the caller should see it: right status, no URL or credentials."""
        if isinstance(exc, ValidationError):
            return exc
        if isinstance(exc, ContextLengthError):  # the request's fault; the upstream's words, scrubbed
            return ContextLengthError(self._scrub(exc.message), policy=policy)
        status = exc.context.get("status")
        reason = self._scrub(exc.message.split(": ", 1)[-1]) if status else ""
        if status in (400, 422):
            return ValidationError(f"the upstream model rejected the request: {reason}", policy=policy,
                                   code="upstream_rejected")
        if status == 429:
            return RateLimitError("the upstream model is rate-limiting this gateway; retry later", policy=policy)
        if status in (401, 403):
            return BackendError("the upstream model refused the gateway's credentials (a gateway configuration "
                                "problem: check its api key environment variable)", policy=policy)
        if status == 404:
            return BackendError(f"the upstream does not serve the model configured for policy {policy!r}",
                                policy=policy)
        if status:
            return BackendError(f"the upstream model failed (HTTP {status})", policy=policy)
        return BackendError("the upstream model is unreachable or its answer was unreadable", policy=policy)

    def _scrub(self, text: str) -> str:
        """An upstream message without addresses or our credentials."""
        if self._api_key:
            text = text.replace(self._api_key, "***")
        return _URL.sub("<url>", text)

    async def _mapped(self, reads: AsyncIterator[list[dict]]) -> AsyncIterator[list[dict]]:
        try:
            async for events in reads:
                yield events
        except SwarmError as exc:
            raise self._error(exc, exc.context.get("policy", "")) from None

    async def generate(self, request: GenerateRequest) -> list[Generation]:
        path, body = self._body(request, stream=False)
        try:
            data = await post_json(self._client, path, body, policy=request.policy)
        except SwarmError as exc:
            raise self._error(exc, request.policy) from None
        top_prompt = data.get("prompt_token_ids") or []
        gens = []
        for ch in sorted(data.get("choices") or [], key=lambda c: c.get("index", 0)):
            local = request.prompt_ids if path == "/completions" else None  # chat: the server tokenized
            prompt_ids = list(ch.get("prompt_token_ids") or top_prompt or local or [])
            if path == "/chat/completions":
                msg = ch.get("message") or {}
                text = msg.get("content") or ""
                ids, lps, entries = chat_token_data(ch.get("logprobs"))
                calls = norm_tool_calls(msg.get("tool_calls"))
            else:
                text = ch.get("text") or ""
                lp = ch.get("logprobs") or {}
                lps = [float(x) for x in lp.get("token_logprobs") or []] or None
                ids = [token_id(t) for t in lp.get("tokens") or []]
                ids = ids if ids and all(i is not None for i in ids) else []
                calls, entries = [], None
            if ch.get("token_ids"):
                ids = list(ch["token_ids"])
            gens.append(UpstreamGeneration(prompt_ids=prompt_ids, response_ids=ids, logprobs=aligned(ids, lps),
                                           logprobs_content=entries, text=text, tool_calls=calls,
                                           finish_reason=ch.get("finish_reason") or "stop", policy_version=0,
                                           usage=_usage(data.get("usage"))))
        if not gens:
            raise BackendError("upstream returned no choices", policy=request.policy)
        return gens

    async def stream(self, request: GenerateRequest) -> AsyncIterator[TokenDelta | Generation]:
        path, body = self._body(request, stream=True)
        chat = path == "/chat/completions"
        acc: dict[int, dict[str, Any]] = {}
        prompt_ids: list[int] = list(request.prompt_ids or []) if not chat else []
        usage: dict[str, Any] | None = None
        async for events in self._mapped(sse_reads(self._client, path, body, policy=request.policy)):
            deltas: list[TokenDelta] = []  # those of one network read: relayed together (coalesced)
            for event in events:
                prompt_ids = list(event.get("prompt_token_ids") or prompt_ids)
                usage = _usage(event.get("usage")) or usage  # the final usage chunk (or vLLM's running stats)
                for ch in event.get("choices") or []:
                    i = int(ch.get("index", 0))
                    a = acc.setdefault(i, {"text": "", "ids": [], "lps": [], "has_lps": False, "entries": None, "calls": {},
                                          "finish": None})
                    prompt_ids = list(ch.get("prompt_token_ids") or prompt_ids)
                    if chat:
                        delta = ch.get("delta") or {}
                        text = delta.get("content") or ""
                        ids, lps, entries = chat_token_data(ch.get("logprobs"))
                        for tc in delta.get("tool_calls") or []:
                            slot = a["calls"].setdefault(tc.get("index", 0), {"id": None, "name": "", "arguments": ""})
                            slot["id"] = tc.get("id") or slot["id"]
                            fn = tc.get("function") or {}
                            slot["name"] += fn.get("name") or ""
                            slot["arguments"] += fn.get("arguments") or ""
                    else:
                        text = ch.get("text") or ""
                        lp = ch.get("logprobs") or {}
                        lps = [float(x) for x in lp.get("token_logprobs") or []] or None
                        ids = [t for t in (token_id(x) for x in lp.get("tokens") or []) if t is not None]
                        entries = None
                    if ch.get("token_ids"):
                        ids = list(ch["token_ids"])
                    a["text"] += text
                    a["ids"] += ids
                    if lps:
                        a["lps"] += lps
                        a["has_lps"] = True
                    if entries:
                        a["entries"] = (a["entries"] or []) + entries
                    a["finish"] = ch.get("finish_reason") or a["finish"]
                    if text or ids or entries:
                        deltas.append(TokenDelta(index=i, token_ids=ids, logprobs=aligned(ids, lps), text=text,
                                                 logprobs_content=entries or None))
            for d in coalesced(deltas):
                yield d
        if not acc:
            raise BackendError("upstream stream ended without choices", policy=request.policy)
        for i in sorted(acc):
            a = acc[i]
            calls = [
                {"id": c["id"] or f"call_{k}", "type": "function",
                 "function": {"name": c["name"], "arguments": c["arguments"]}}
                for k, c in sorted(a["calls"].items())
            ]
            yield UpstreamGeneration(prompt_ids=prompt_ids, response_ids=a["ids"],
                                     logprobs=aligned(a["ids"], a["lps"] if a["has_lps"] else None),
                                     logprobs_content=a["entries"], text=a["text"], tool_calls=calls,
                                     finish_reason=a["finish"] or "stop", policy_version=0, usage=usage)


@BACKENDS.declare("upstream")
class UpstreamSettings(derive(UpstreamBackend, skip=("policies", "api_key", "transport"),  # type: ignore[misc]
                              base=BackendSection)):
    """``backend: upstream``: any OpenAI-compatible server, frozen (the api key comes from ``api_key_env``)."""

    def build(self, policies: list[str], lora: LoraSpec | None) -> UpstreamBackend:
        return UpstreamBackend(policies=list(policies), **self.args())
