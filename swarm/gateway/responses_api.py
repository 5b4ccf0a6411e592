"""OpenAI's Responses API (``POST /v1/responses``) as a translation of chat completions.

:class:`ResponsesRequest` is the request body; :func:`to_chat` turns it into the chat request the
gateway runs (``instructions`` -> a system message; input items -> messages, with ``function_call``
items folded into the assistant message before them and ``function_call_output`` items as tool
messages; flat function tools -> chat tools; ``text.format`` -> ``response_format``;
``max_output_tokens`` -> ``max_tokens``; ``include: ["message.output_text.logprobs"]`` ->
``logprobs``). The translation is deterministic, so a client that resends the input plus the
output items it got back extends the previous call and keeps exact token prefixes.
:class:`ResponsesTranslator` turns the chat chunks back into a Response object or its stream of
``response.*`` events.

``previous_response_id`` continues a response of the same episode from the pool: its input
messages (without its ``instructions``, which are not carried over, as in OpenAI's API) and its
reply come before the new input (:func:`history_of`), so such a turn extends the previous one
exactly like a client that resends everything.

Not supported (a 400 naming the field): ``conversation`` objects, ``background``, hosted tools (web
search, file search, computer ...), image / file / audio inputs. ``reasoning``, ``store`` and
``truncation`` are accepted and have no effect (every call is stored in the pool); ``reasoning``
input items are skipped.
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from swarm.gateway.bridge import ChatRun
from swarm.gateway.schemas import ChatCompletionRequest, _Storable
from swarm.records import Step
from swarm.web.errors import ApiError, error_body

__all__ = ["ResponsesRequest", "to_chat", "history_of", "ResponsesTranslator", "PARAMS", "LOGPROBS_INCLUDE"]

_OPEN = ConfigDict(extra="allow", allow_inf_nan=False, populate_by_name=True)
LOGPROBS_INCLUDE = "message.output_text.logprobs"
_TEXT_PARTS = ("input_text", "output_text", "text")
# chat parameter names in errors -> this protocol's
PARAMS = {"max_tokens": "max_output_tokens", "max_completion_tokens": "max_output_tokens", "messages": "input",
          "response_format": "text.format", "stop": "stop"}


class ContentPart(BaseModel):
    model_config = _OPEN
    type: str
    text: str | None = None
    refusal: str | None = None


class InputItem(BaseModel):
    """One input item: a message (``type`` may be left out), a function call or a function call's output."""

    model_config = _OPEN
    type: str | None = None
    role: Literal["user", "assistant", "system", "developer"] | None = None
    content: str | list[ContentPart] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | list[ContentPart] | None = None


class FunctionTool(BaseModel):
    model_config = _OPEN
    type: str = "function"
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class TextFormat(BaseModel):
    model_config = _OPEN
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextConfig(BaseModel):
    model_config = _OPEN
    format: TextFormat | None = None


class ResponsesRequest(_Storable):
    """OpenAI ``POST /v1/responses`` body (unknown fields are accepted, as on chat completions)."""

    model_config = _OPEN
    model: str = Field(min_length=1)
    input: str | list[InputItem]
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    include: list[str] | None = None
    text: TextConfig | None = None
    stream: bool | None = False
    previous_response_id: str | None = None
    conversation: Any = None
    background: bool | None = None
    store: bool | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None


def _text(parts: str | list[ContentPart] | None, param: str) -> str:
    """The text of a content field; image, file or audio parts are a 400 (text-only models)."""
    if parts is None or isinstance(parts, str):
        return parts or ""
    out = []
    for j, p in enumerate(parts):
        if p.type in _TEXT_PARTS:
            out.append(p.text or "")
        elif p.type == "refusal":
            out.append(p.refusal or "")
        else:
            raise ApiError(400, f"content part of type {p.type!r} is not supported: this gateway serves text-only "
                           "models", param=f"{param}.{j}", code="unsupported_content")
    return "\n".join(out)


def history_of(step: Step) -> list[dict[str, Any]]:
    """The conversation a stored step continues with: its prompt messages (minus the system message its
    ``instructions`` made) and its reply as an assistant message."""
    msgs = list(step.prompt_messages or [])
    if step.metadata.get("instructions") and msgs and msgs[0].get("role") == "system":
        msgs = msgs[1:]
    reply: dict[str, Any] = {"role": "assistant", "content": step.response_text or None}
    return msgs + [reply | ({"tool_calls": step.tool_calls} if step.tool_calls else {})]


def _messages(req: ResponsesRequest, history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": req.instructions}] if req.instructions else []
    msgs += history
    items = [InputItem(role="user", content=req.input)] if isinstance(req.input, str) else req.input
    calls_open = False  # whether a function_call item may join the last assistant message
    for i, it in enumerate(items):
        kind = it.type or "message"
        if kind == "message":
            if it.role is None:
                raise ApiError(400, f"input.{i}: a message item needs a role", param=f"input.{i}.role",
                               code="invalid_value")
            msgs.append({"role": it.role, "content": _text(it.content, f"input.{i}.content")})
            calls_open = it.role == "assistant"
        elif kind == "function_call":
            if not it.name or it.call_id is None:
                raise ApiError(400, f"input.{i}: a function_call needs name and call_id", param=f"input.{i}",
                               code="invalid_value")
            call = {"id": it.call_id, "type": "function", "function": {"name": it.name, "arguments": it.arguments or ""}}
            if not calls_open:
                msgs.append({"role": "assistant", "content": None})
                calls_open = True
            msgs[-1].setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            msgs.append({"role": "tool", "tool_call_id": it.call_id, "content": _text(it.output, f"input.{i}.output")})
            calls_open = False
        elif kind == "reasoning":
            continue  # no reasoning is produced here; a client echoing another model's is not refused
        else:
            raise ApiError(400, f"input item type {kind!r} is not supported (messages, function_call, "
                           "function_call_output)", param=f"input.{i}.type", code="unsupported_value")
    return msgs


def _tools(req: ResponsesRequest) -> list[dict[str, Any]] | None:
    if not req.tools:
        return None
    out = []
    for i, t in enumerate(req.tools):
        if t.type != "function" or not t.name:
            raise ApiError(400, f"tools.{i}: only function tools with a name are supported here (got {t.type!r})",
                           param=f"tools.{i}.type", code="unsupported_value")
        fn = {"name": t.name, "description": t.description, "parameters": t.parameters, "strict": t.strict}
        out.append({"type": "function", "function": {k: v for k, v in fn.items() if v is not None}})
    return out


def _tool_choice(choice: Any) -> Any:
    if not isinstance(choice, dict):
        return choice
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise ApiError(400, "tool_choice: only 'none', 'auto', 'required' or {'type': 'function', 'name': ...} are "
                   "supported", param="tool_choice", code="unsupported_value")


def _response_format(text: TextConfig | None) -> dict[str, Any] | None:
    f = text.format if text is not None else None
    if f is None or f.type == "text":
        return None
    if f.type == "json_object":
        return {"type": "json_object"}
    spec = {"name": f.name or "output", "schema": f.json_schema, "strict": f.strict, "description": f.description}
    return {"type": "json_schema", "json_schema": {k: v for k, v in spec.items() if v is not None}}


def to_chat(req: ResponsesRequest, history: list[dict[str, Any]] | None = None) -> ChatCompletionRequest:
    """The chat completions request this Responses request runs as (a 400 for what cannot be translated).

    ``history``: the messages ``previous_response_id`` stands for (:func:`history_of`), before the input.
    """
    for name in ("conversation", "background"):
        if getattr(req, name):
            raise ApiError(400, f"{name} is not supported: send the conversation as input (or previous_response_id)",
                           param=name, code="unsupported_parameter")
    want_lps = LOGPROBS_INCLUDE in (req.include or []) or bool(req.top_logprobs)
    chat = {"model": req.model, "messages": _messages(req, history or []), "tools": _tools(req),
            "tool_choice": _tool_choice(req.tool_choice), "parallel_tool_calls": req.parallel_tool_calls,
            "max_tokens": req.max_output_tokens, "temperature": req.temperature, "top_p": req.top_p,
            "logprobs": want_lps, "top_logprobs": req.top_logprobs if want_lps else None,
            "response_format": _response_format(req.text), "stream": bool(req.stream), "user": req.user}
    if not chat["messages"]:
        raise ApiError(400, "input is empty", param="input", code="invalid_value")
    return ChatCompletionRequest.model_validate({k: v for k, v in chat.items() if v is not None})


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponsesTranslator:
    """Chat chunks -> ``response.*`` stream events, and the final Response object (see the module docstring)."""

    def __init__(self, req: ResponsesRequest, run: ChatRun) -> None:
        self.req, self.run = req, run
        self.want_lps = LOGPROBS_INCLUDE in (req.include or []) or bool(req.top_logprobs)
        self.seq = 0
        self.msg_id: str | None = None
        self.text = ""
        self.logprobs: list[dict[str, Any]] = []
        self.pending: list[dict[str, Any]] = []
        self.calls: list[dict[str, Any]] = []
        self.finish: str | None = None
        self.usage: dict[str, int] = {}
        self.swarm: dict[str, Any] = {}

    def _ev(self, kind: str, **fields: Any) -> dict[str, Any]:
        ev = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return ev

    @property
    def _status(self) -> str:
        return "incomplete" if self.finish == "length" else "completed"

    def _part(self) -> dict[str, Any]:
        return {"type": "output_text", "text": self.text, "annotations": [], "logprobs": list(self.logprobs)}

    def _message(self, status: str) -> dict[str, Any]:
        return {"type": "message", "id": self.msg_id, "status": status, "role": "assistant",
                "content": [self._part()] if status != "in_progress" else []}

    def _call(self, k: int, status: str) -> dict[str, Any]:
        c = self.calls[k]
        return {"type": "function_call", "id": c["item_id"], "call_id": c["id"], "name": c["function"]["name"],
                "arguments": c["function"]["arguments"] if status != "in_progress" else "", "status": status}

    def _output(self, status: str) -> list[dict[str, Any]]:
        out = [self._message(status)] if self.msg_id else []
        return out + [self._call(k, status) for k in range(len(self.calls))]

    def _response(self, status: str) -> dict[str, Any]:
        r, u = self.req, self.usage
        fmt = r.text.format.model_dump(by_alias=True, exclude_none=True) if r.text and r.text.format else {"type": "text"}
        body: dict[str, Any] = {
            "id": self.run.cid, "object": "response", "created_at": self.run.created, "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": r.instructions, "max_output_tokens": r.max_output_tokens, "model": self.run.model,
            "output": self._output(status) if status != "in_progress" else [],
            "parallel_tool_calls": r.parallel_tool_calls is not False, "previous_response_id": r.previous_response_id,
            "reasoning": {"effort": None, "summary": None}, "store": r.store is not False,
            "temperature": 1.0 if r.temperature is None else r.temperature,
            "text": {"format": fmt}, "tool_choice": r.tool_choice or "auto",
            "tools": [t.model_dump(exclude_none=True) for t in r.tools or []],
            "top_p": 1.0 if r.top_p is None else r.top_p, "top_logprobs": r.top_logprobs, "truncation": "disabled",
            "usage": None, "user": r.user, "metadata": r.metadata or {},
        }
        if status != "in_progress":
            body["usage"] = {"input_tokens": u.get("prompt_tokens", self.run.prompt_tokens),
                             "input_tokens_details": {"cached_tokens": 0},
                             "output_tokens": u.get("completion_tokens", 0),
                             "output_tokens_details": {"reasoning_tokens": 0},
                             "total_tokens": u.get("total_tokens", self.run.prompt_tokens)}
            body["swarm"] = {**self.swarm, "episode_id": self.run.episode_id}
        return body

    def _open_message(self) -> list[dict[str, Any]]:
        if self.msg_id is not None:
            return []
        self.msg_id = _id("msg")
        return [self._ev("response.output_item.added", output_index=0, item=self._message("in_progress")),
                self._ev("response.content_part.added", item_id=self.msg_id, output_index=0, content_index=0,
                         part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})]

    def start(self) -> list[dict[str, Any]]:
        return [self._ev("response.created", response=self._response("in_progress")),
                self._ev("response.in_progress", response=self._response("in_progress"))]

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        out: list[dict[str, Any]] = []
        for ch in chunk.get("choices") or []:
            delta = ch.get("delta") or {}
            lps = ((ch.get("logprobs") or {}).get("content") or []) if self.want_lps else []
            self.logprobs += lps
            self.pending += lps
            if delta.get("content"):
                out += self._open_message()
                self.text += delta["content"]
                out.append(self._ev("response.output_text.delta", item_id=self.msg_id, output_index=0,
                                    content_index=0, delta=delta["content"], logprobs=self.pending))
                self.pending = []
            for c in delta.get("tool_calls") or []:
                self.calls.append({**{k: v for k, v in c.items() if k != "index"}, "item_id": _id("fc")})
            if ch.get("finish_reason"):
                self.finish = ch["finish_reason"]
                self.swarm = dict(chunk.get("swarm") or {})
        return out

    def end(self) -> list[dict[str, Any]]:
        out = self._open_message() if not self.calls else []  # a reply with no text and no call: an empty message
        status = self._status
        if self.msg_id is not None:
            out += [self._ev("response.output_text.done", item_id=self.msg_id, output_index=0, content_index=0,
                             text=self.text, logprobs=list(self.logprobs)),
                    self._ev("response.content_part.done", item_id=self.msg_id, output_index=0, content_index=0,
                             part=self._part()),
                    self._ev("response.output_item.done", output_index=0, item=self._message(status))]
        base = 1 if self.msg_id else 0
        for k, c in enumerate(self.calls):
            idx, args = base + k, c["function"]["arguments"]
            out += [self._ev("response.output_item.added", output_index=idx, item=self._call(k, "in_progress")),
                    self._ev("response.function_call_arguments.delta", item_id=c["item_id"], output_index=idx,
                             delta=args),
                    self._ev("response.function_call_arguments.done", item_id=c["item_id"], output_index=idx,
                             name=c["function"]["name"], arguments=args),
                    self._ev("response.output_item.done", output_index=idx, item=self._call(k, status))]
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return out + [self._ev(kind, response=self._response(status))]

    def body(self) -> dict[str, Any]:
        return self._response(self._status)

    def error(self, err: ApiError) -> dict[str, Any]:
        """The stream's ``error`` event (its ``error`` object makes the OpenAI SDK raise ``APIError``)."""
        return self._ev("error", code=err.code, message=err.message, param=err.param,
                        **error_body(err.message, err.type, err.param, err.code))
