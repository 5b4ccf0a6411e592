"""The ``upstream`` backend: any OpenAI-compatible server (frozen opponents, judges, API models).

Chat requests go to ``/chat/completions`` and raw prompt ids to ``/completions`` over httpx (the
transport is injectable, e.g. ``httpx.MockTransport`` in tests). It records the text, the tool
calls and whatever token data the server returns: logprobs from ``logprobs.content``, token ids
from ``token_id:<n>`` token strings or ``token_ids`` / ``prompt_token_ids`` fields (vLLM). When
the server returns none, the ids are empty and the logprobs ``None``: such steps are fine for
evaluation and opponents, not for training.

``response_format`` / ``tool_choice`` constraints are passed on in OpenAI's form for the server to
enforce; the step records the constraint, but the trainer cannot replay a server's own masks.

It does not train: the version is always 0 and ``load_weights`` raises. It has no tokenizer
unless ``tokenizer_path`` is given, so ``render_chat`` / ``encode`` / ``decode`` raise without one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx

from swarm.errors import BackendError, NotFoundError
from swarm.policy._http import post_json, sse_events, token_id
from swarm.policy.base import GenerateRequest, Generation, TokenDelta
from swarm.policy.chat import LocalTokenizer

__all__ = ["UpstreamBackend"]


def _sampling_body(request: GenerateRequest) -> dict[str, Any]:
    s = request.sampling
    body: dict[str, Any] = {"max_tokens": s.max_tokens, "temperature": s.temperature, "top_p": s.top_p, "n": s.n}
    if s.stop:
        body["stop"] = list(s.stop)
    if s.seed is not None:
        body["seed"] = s.seed
    return body


def _chat_token_data(logprobs: Any) -> tuple[list[int], list[float] | None]:
    content = (logprobs or {}).get("content") if isinstance(logprobs, dict) else None
    if not content:
        return [], None
    lps = [float(t.get("logprob", 0.0)) for t in content]
    ids = [token_id(t.get("token")) for t in content]
    return ([i for i in ids if i is not None] if all(i is not None for i in ids) else []), lps


def _norm_tool_calls(calls: Any) -> list[dict[str, Any]]:
    out = []
    for c in calls or []:
        fn = c.get("function") or {}
        args = fn.get("arguments")
        out.append(
            {
                "id": c.get("id") or f"call_{len(out)}",
                "type": "function",
                "function": {"name": fn.get("name", ""), "arguments": args if isinstance(args, str) else "{}"},
            }
        )
    return out


class UpstreamBackend(LocalTokenizer):
    """Client of an OpenAI-compatible server implementing :class:`~swarm.policy.base.PolicyBackend`.

    ``policies``: names served (a list: each maps to ``model``, or to itself when ``model`` is
    None; or a dict ``name -> upstream model id``). ``extra_body`` is merged into every request
    (e.g. ``{"return_token_ids": True}`` for vLLM). ``logprobs=False`` for servers that reject it.
    """

    supports_constraints = True  # passed on to the server (see _body)

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
    ) -> None:
        if isinstance(policies, str):
            policies = [policies]
        self._models = dict(policies) if isinstance(policies, dict) else {p: model or p for p in policies}
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = base_url.rstrip("/")
        self._client = httpx.AsyncClient(
            base_url=self.base_url, headers=headers, transport=transport, timeout=httpx.Timeout(timeout_s)
        )
        self._max_context = int(max_context)
        self._logprobs = logprobs
        self._extra = dict(extra_body or {})
        self.tokenizer = None
        if tokenizer_path:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)

    async def aclose(self) -> None:
        await self._client.aclose()

    def _model(self, policy: str) -> str:
        if policy not in self._models:
            raise NotFoundError(f"unknown policy {policy!r}; served: {sorted(self._models)}", policy=policy)
        return self._models[policy]

    def _tokenizer_for(self, policy: str) -> Any:
        self._model(policy)
        if self.tokenizer is None:
            raise BackendError("the upstream backend has no local tokenizer (pass tokenizer_path)", policy=policy)
        return self.tokenizer

    # ----------------------------------------------------------------------------- protocol
    def policies(self) -> list[str]:
        return list(self._models)

    def version(self, policy: str) -> int:
        self._model(policy)
        return 0

    def max_context(self, policy: str) -> int:
        self._model(policy)
        return self._max_context

    def load_weights(self, policy: str, adapter_state: dict[str, Any], version: int) -> None:
        raise BackendError("the upstream backend serves frozen weights; load_weights is not supported", policy=policy)

    def _body(self, request: GenerateRequest, stream: bool) -> tuple[str, dict[str, Any]]:
        body: dict[str, Any] = {"model": self._model(request.policy), **_sampling_body(request), **self._extra}
        if stream:
            body["stream"] = True
        if request.messages is not None:
            body["messages"] = request.messages
            if request.tools:
                body["tools"] = request.tools
            if self._logprobs:
                body["logprobs"] = True
            if request.constraint is not None:  # OpenAI's own fields: the server enforces them
                body.update(request.constraint.openai_fields())
            return "/chat/completions", body
        if request.prompt_ids is None:
            from swarm.errors import ValidationError

            raise ValidationError("request needs messages or prompt_ids", policy=request.policy)
        body["prompt"] = list(request.prompt_ids)
        if self._logprobs:
            body["logprobs"] = 1
        if request.constraint is not None:
            fields = request.constraint.openai_fields()
            if "response_format" not in fields:
                from swarm.errors import ValidationError

                raise ValidationError("tool_choice needs a chat request on the upstream backend", param="tool_choice")
            body.update(fields)  # /v1/completions + response_format: vLLM and SGLang accept it
        return "/completions", body

    async def generate(self, request: GenerateRequest) -> list[Generation]:
        path, body = self._body(request, stream=False)
        data = await post_json(self._client, path, body, policy=request.policy)
        top_prompt = data.get("prompt_token_ids") or []
        gens = []
        for ch in sorted(data.get("choices") or [], key=lambda c: c.get("index", 0)):
            prompt_ids = list(ch.get("prompt_token_ids") or top_prompt or request.prompt_ids or [])
            if path == "/chat/completions":
                msg = ch.get("message") or {}
                text = msg.get("content") or ""
                ids, lps = _chat_token_data(ch.get("logprobs"))
                calls = _norm_tool_calls(msg.get("tool_calls"))
            else:
                text = ch.get("text") or ""
                lp = ch.get("logprobs") or {}
                lps = [float(x) for x in lp.get("token_logprobs") or []] or None
                ids = [token_id(t) for t in lp.get("tokens") or []]
                ids = ids if ids and all(i is not None for i in ids) else []
                calls = []
            if ch.get("token_ids"):
                ids = list(ch["token_ids"])
            gens.append(
                Generation(
                    prompt_ids=prompt_ids,
                    response_ids=ids,
                    logprobs=lps,
                    text=text,
                    tool_calls=calls,
                    finish_reason=ch.get("finish_reason") or "stop",
                    policy_version=0,
                )
            )
        if not gens:
            raise BackendError("upstream returned no choices", policy=request.policy)
        return gens

    async def stream(self, request: GenerateRequest) -> AsyncIterator[TokenDelta | Generation]:
        path, body = self._body(request, stream=True)
        chat = path == "/chat/completions"
        acc: dict[int, dict[str, Any]] = {}
        prompt_ids: list[int] = list(request.prompt_ids or [])
        async for event in sse_events(self._client, path, body, policy=request.policy):
            prompt_ids = list(event.get("prompt_token_ids") or prompt_ids)
            for ch in event.get("choices") or []:
                i = int(ch.get("index", 0))
                a = acc.setdefault(i, {"text": "", "ids": [], "lps": [], "has_lps": False, "calls": {}, "finish": None})
                prompt_ids = list(ch.get("prompt_token_ids") or prompt_ids)
                if chat:
                    delta = ch.get("delta") or {}
                    text = delta.get("content") or ""
                    ids, lps = _chat_token_data(ch.get("logprobs"))
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
                if ch.get("token_ids"):
                    ids = list(ch["token_ids"])
                a["text"] += text
                a["ids"] += ids
                if lps:
                    a["lps"] += lps
                    a["has_lps"] = True
                a["finish"] = ch.get("finish_reason") or a["finish"]
                if text or ids:
                    yield TokenDelta(index=i, token_ids=ids, logprobs=lps, text=text)
        if not acc:
            raise BackendError("upstream stream ended without choices", policy=request.policy)
        for i in sorted(acc):
            a = acc[i]
            calls = [
                {
                    "id": c["id"] or f"call_{k}",
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["arguments"]},
                }
                for k, c in sorted(a["calls"].items())
            ]
            yield Generation(
                prompt_ids=prompt_ids,
                response_ids=a["ids"],
                logprobs=a["lps"] if a["has_lps"] else None,
                text=a["text"],
                tool_calls=calls,
                finish_reason=a["finish"] or "stop",
                policy_version=0,
            )
