"""Anthropic's Messages API (``POST /v1/messages``) as a translation of chat completions.

:class:`MessagesRequest` is the request body; :func:`to_chat` turns it into the chat request the
gateway runs (``system`` -> a system message; ``text`` blocks -> message text; assistant
``tool_use`` blocks -> ``tool_calls`` with the input as JSON arguments; ``tool_result`` blocks ->
tool messages, in their order; tools' ``input_schema`` -> function ``parameters``; ``tool_choice``
``auto|any|tool|none`` -> ``auto|required|named|none``; ``stop_sequences`` -> ``stop``;
``output_config.format`` (a JSON schema) -> ``response_format``). The translation is
deterministic, so a client that appends the content it got back extends the previous call and
keeps exact token prefixes. :class:`MessagesTranslator` turns the chat chunks back into a Message
or its stream of ``message_start`` ... ``message_stop`` events; :func:`anthropic_error` is the
error shape ``{"type": "error", "error": {"type", "message", "param", "code"}}``.

``max_tokens`` (required by the protocol) is a ceiling: Anthropic clients send large fixed values
(8192, 32000), so a value over what fits in the context, or over the gateway's cap, samples what
fits instead of being refused (chat completions refuses it).

``top_k`` samples from the k likeliest tokens (the recorded logprobs are those of that
distribution). Accepted without effect: ``thinking`` (no thinking blocks are produced; ones sent back are skipped),
``output_config.effort``, ``metadata``. Images and documents are a 400 (text-only models); server
tools (``type`` other than ``custom``) are a 400, and so is a last assistant message (prefill: the
chat path would start a new turn, not continue that one). ``stop_reason`` is ``end_turn``, ``max_tokens`` or
``tool_use``: a matched stop sequence reads as ``end_turn``.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from swarm.gateway.bridge import ChatRun
from swarm.gateway.schemas import ChatCompletionRequest, _Storable
from swarm.web.errors import ApiError, error_body

__all__ = ["MessagesRequest", "CountTokensRequest", "to_chat", "MessagesTranslator", "anthropic_error", "error_response", "PARAMS"]

_OPEN = ConfigDict(extra="allow", allow_inf_nan=False)
PARAMS = {"max_tokens": "max_tokens", "messages": "messages", "stop": "stop_sequences",
          "response_format": "output_config.format"}
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 529: "overloaded_error"}
_STOP = {"tool_calls": "tool_use", "length": "max_tokens"}


class Block(BaseModel):
    """A content block: ``text``, ``tool_use``, ``tool_result`` (``thinking`` is skipped, others refused)."""

    model_config = _OPEN
    type: str
    text: str | None = None
    id: str | None = None
    name: str | None = None
    input: Any = None
    tool_use_id: str | None = None
    content: str | list[Block] | None = None


class Message(BaseModel):
    model_config = _OPEN
    role: Literal["user", "assistant"]
    content: str | list[Block]


class Tool(BaseModel):
    model_config = _OPEN
    type: str | None = None
    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any] | None = None


class OutputFormat(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False, populate_by_name=True)
    type: Literal["json_schema"]
    json_schema: dict[str, Any] = Field(alias="schema")


class OutputConfig(BaseModel):
    model_config = _OPEN
    format: OutputFormat | None = None


class MessagesRequest(_Storable):
    """Anthropic ``POST /v1/messages`` body (unknown fields are accepted)."""

    model_config = _OPEN
    model: str = Field(min_length=1)
    max_tokens: int = Field(ge=1)
    messages: list[Message] = Field(min_length=1)
    system: str | list[Block] | None = None
    tools: list[Tool] | None = None
    tool_choice: dict[str, Any] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    stream: bool | None = False
    metadata: dict[str, Any] | None = None
    output_config: OutputConfig | None = None


class CountTokensRequest(MessagesRequest):
    """Anthropic ``POST /v1/messages/count_tokens`` body: a Messages body without ``max_tokens``."""

    max_tokens: int = Field(default=1, ge=1)


def _block_text(blocks: str | list[Block] | None, param: str) -> str:
    """The text of a content field made of text blocks (a tool result's content, the system prompt)."""
    if blocks is None or isinstance(blocks, str):
        return blocks or ""
    out = []
    for j, b in enumerate(blocks):
        if b.type != "text":
            raise ApiError(400, f"content block of type {b.type!r} is not supported here: this gateway serves "
                           "text-only models", param=f"{param}.{j}", code="unsupported_content")
        out.append(b.text or "")
    return "\n".join(out)


def _arguments(value: Any) -> str:
    return json.dumps({} if value is None else value, ensure_ascii=False)


def _message(i: int, m: Message) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages (a user turn may become tool messages and a user message)."""
    if isinstance(m.content, str):
        return [{"role": m.role, "content": m.content}]
    out: list[dict[str, Any]] = []
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, b in enumerate(m.content):
        param = f"messages.{i}.content.{j}"
        if b.type == "text":
            text.append(b.text or "")
        elif b.type in ("thinking", "redacted_thinking"):
            continue
        elif b.type == "tool_use" and m.role == "assistant":
            if not b.id or not b.name:
                raise ApiError(400, f"{param}: a tool_use block needs id and name", param=param, code="invalid_value")
            calls.append({"id": b.id, "type": "function", "function": {"name": b.name, "arguments": _arguments(b.input)}})
        elif b.type == "tool_result" and m.role == "user":
            if text:  # keep the order: text written before this result is its own user message
                out.append({"role": "user", "content": "\n".join(text)})
                text = []
            out.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": _block_text(b.content, param)})
        else:
            raise ApiError(400, f"content block of type {b.type!r} is not supported in a {m.role} message",
                           param=param, code="unsupported_content")
    if m.role == "assistant":
        msg: dict[str, Any] = {"role": "assistant", "content": "\n".join(text) if text else None}
        return out + [msg | ({"tool_calls": calls} if calls else {})]
    return out + ([{"role": "user", "content": "\n".join(text)}] if text or not out else [])


def _tools(req: MessagesRequest) -> list[dict[str, Any]] | None:
    out = []
    for i, t in enumerate(req.tools or []):
        if t.type not in (None, "custom"):
            raise ApiError(400, f"tools.{i}: server tools ({t.type!r}) are not supported; declare custom tools",
                           param=f"tools.{i}.type", code="unsupported_value")
        fn = {"name": t.name, "description": t.description, "parameters": t.input_schema}
        out.append({"type": "function", "function": {k: v for k, v in fn.items() if v is not None}})
    return out or None


def _tool_choice(choice: dict[str, Any] | None) -> tuple[Any, bool | None]:
    """(chat ``tool_choice``, ``parallel_tool_calls``) for an Anthropic ``tool_choice``."""
    if choice is None:
        return None, None
    parallel = False if choice.get("disable_parallel_tool_use") else None
    kind = choice.get("type")
    if kind in ("auto", "none"):
        return kind, parallel
    if kind == "any":
        return "required", parallel
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}, parallel
    raise ApiError(400, "tool_choice: expected type auto, any, none, or tool with a name", param="tool_choice",
                   code="invalid_value")


def to_chat(req: MessagesRequest) -> ChatCompletionRequest:
    """The chat completions request this Messages request runs as (a 400 for what cannot be translated).

    ``max_tokens`` is left out: the route passes it as a ceiling (:func:`swarm.gateway.bridge.run_chat`).
    """
    last = len(req.messages) - 1
    if req.messages[last].role == "assistant":
        raise ApiError(400, f"messages.{last}: a last assistant message (prefill) is not supported: the reply would "
                       "start a new turn instead of continuing it", param=f"messages.{last}", code="unsupported_value")
    msgs = [{"role": "system", "content": _block_text(req.system, "system")}] if req.system else []
    for i, m in enumerate(req.messages):
        msgs += _message(i, m)
    choice, parallel = _tool_choice(req.tool_choice)
    fmt = req.output_config.format if req.output_config else None
    chat = {"model": req.model, "messages": msgs, "tools": _tools(req), "tool_choice": choice,
            "parallel_tool_calls": parallel, "temperature": req.temperature,
            "top_p": req.top_p, "top_k": req.top_k, "stop": req.stop_sequences, "stream": bool(req.stream),
            "response_format": None if fmt is None else
            {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt.json_schema, "strict": True}},
            "user": (req.metadata or {}).get("user_id") if isinstance((req.metadata or {}).get("user_id"), str)
            else None}
    return ChatCompletionRequest.model_validate({k: v for k, v in chat.items() if v is not None})


def _input(arguments: str) -> dict[str, Any]:
    """A tool call's JSON arguments as a ``tool_use`` input object (non-object JSON is wrapped)."""
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {"arguments": arguments}
    return value if isinstance(value, dict) else {"value": value}


class MessagesTranslator:
    """Chat chunks -> Anthropic stream events, and the final Message (see the module docstring)."""

    def __init__(self, req: MessagesRequest, run: ChatRun) -> None:
        self.req, self.run = req, run
        self.text: str | None = None  # None until a text block is open
        self.calls: list[dict[str, Any]] = []
        self.finish: str | None = None
        self.output_tokens = 0
        self.swarm: dict[str, Any] = {}

    def _message(self, content: list[dict[str, Any]], stop: str | None, output_tokens: int) -> dict[str, Any]:
        return {"id": self.run.cid, "type": "message", "role": "assistant", "model": self.run.model,
                "content": content, "stop_reason": stop, "stop_sequence": None,
                "usage": {"input_tokens": self.run.prompt_tokens, "output_tokens": output_tokens,
                          "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}

    def _tool_use(self, c: dict[str, Any]) -> dict[str, Any]:
        return {"type": "tool_use", "id": c["id"], "name": c["function"]["name"], "input": _input(c["function"]["arguments"])}

    def start(self) -> list[dict[str, Any]]:
        return [{"type": "message_start", "message": self._message([], None, 0)}, {"type": "ping"}]

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        if chunk.get("usage"):
            self.output_tokens = chunk["usage"].get("completion_tokens", 0)
        out: list[dict[str, Any]] = []
        for ch in chunk.get("choices") or []:
            delta = ch.get("delta") or {}
            if delta.get("content"):
                if self.text is None:
                    self.text = ""
                    out.append({"type": "content_block_start", "index": 0,
                                "content_block": {"type": "text", "text": ""}})
                self.text += delta["content"]
                out.append({"type": "content_block_delta", "index": 0,
                            "delta": {"type": "text_delta", "text": delta["content"]}})
            self.calls += [{k: v for k, v in c.items() if k != "index"} for c in delta.get("tool_calls") or []]
            if ch.get("finish_reason"):
                self.finish = ch["finish_reason"]
                self.swarm = {**(chunk.get("swarm") or {}), "episode_id": self.run.episode_id}
        return out

    def end(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self.text is None and not self.calls:  # an empty reply is one empty text block
            self.text = ""
            out.append({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
        first = 0 if self.text is None else 1
        if self.text is not None:
            out.append({"type": "content_block_stop", "index": 0})
        for k, c in enumerate(self.calls):
            block = self._tool_use(c)
            out += [{"type": "content_block_start", "index": first + k, "content_block": {**block, "input": {}}},
                    {"type": "content_block_delta", "index": first + k,
                     "delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"],
                                                                                      ensure_ascii=False)}},
                    {"type": "content_block_stop", "index": first + k}]
        out.append({"type": "message_delta", "delta": {"stop_reason": self._stop, "stop_sequence": None},
                    "usage": {"output_tokens": self.output_tokens}, "swarm": self.swarm})
        return out + [{"type": "message_stop"}]

    @property
    def _stop(self) -> str:
        return _STOP.get(self.finish or "", "end_turn")

    def body(self) -> dict[str, Any]:
        content = [] if self.text is None else [{"type": "text", "text": self.text}]
        content += [self._tool_use(c) for c in self.calls]
        return self._message(content, self._stop, self.output_tokens) | {"swarm": self.swarm}

    def error(self, err: ApiError) -> dict[str, Any]:
        return anthropic_error(err)


def anthropic_error(err: ApiError) -> dict[str, Any]:
    """Anthropic's error body for ``err``: ``{"type": "error", "error": {"type", "message"}}``.

    The error object also carries our ``param`` and ``code`` (as on every other route); clients ignore them.
    """
    kind = _ERROR_TYPES.get(err.status, "invalid_request_error" if err.status < 500 else "api_error")
    return {"type": "error", "error": {**error_body(err.message, kind, err.param, err.code)["error"]}}


def error_response(err: ApiError) -> JSONResponse:
    return JSONResponse(anthropic_error(err), status_code=err.status)
