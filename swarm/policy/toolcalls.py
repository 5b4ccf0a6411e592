"""Tool-call parsers, one per chat-template family, chosen per model (``model.tool_parser``).

Like vLLM's ``--tool-call-parser``, the parser is a property of the model's chat format:

- ``hermes`` (Qwen2.5, Qwen3, Hermes, our tiny ChatML): each call is a JSON object
  ``{"name": ..., "arguments": {...}}`` between ``<tool_call>\\n`` and ``\\n</tool_call>``.
- ``llama3_json`` (Llama-3.1/3.2 JSON tool calling): the reply *is* the call, a JSON object
  ``{"name": ..., "parameters": {...}}`` (optionally after ``<|python_tag|>``); several calls are
  separated by ``;``. Text before the first ``{`` means a plain answer.
- ``mistral`` (Mistral v3 style): ``[TOOL_CALLS]`` followed by a JSON list of
  ``{"name": ..., "arguments": {...}}`` objects.

Every parser exposes ``call_prefix``, ``call_suffix`` and ``arguments_key``: one call is emitted
as ``call_prefix + json({"name": name, arguments_key: {...}}) + call_suffix`` (what constrained
decoding builds grammars from), and ``markers``: streamed text is held back from the first
marker on. A block that does not parse (bad JSON, no name, unterminated) is not a tool call: it
stays in the content text as generated. Arguments are not validated against the tool schemas,
and nothing here raises on model output. JSON is parsed with the standard library only.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from swarm.errors import ValidationError

__all__ = ["new_call_id", "ToolParser", "TOOL_PARSERS", "get_tool_parser", "split_tool_calls", "TOOL_CALL_OPEN", "TOOL_CALL_CLOSE"]

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"


def new_call_id() -> str:
    """A fresh tool-call id in OpenAI's shape (``call_`` and 24 hex characters)."""
    return f"call_{uuid.uuid4().hex[:24]}"


def _to_call(obj: Any) -> dict[str, Any] | None:
    """An OpenAI ``tool_calls`` entry from a decoded ``{"name", "arguments" | "parameters"}`` object."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # already JSON text: keep it only if it is valid JSON
        try:
            json.loads(args)
        except (ValueError, RecursionError):
            return None
        args_text = args
    else:
        args_text = json.dumps({} if args is None else args, ensure_ascii=False)
    return {"id": new_call_id(), "type": "function", "function": {"name": obj["name"], "arguments": args_text}}


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


@dataclass(frozen=True)
class ToolParser:
    """One family's tool-call syntax (see the module docstring); :meth:`split` never raises."""

    name: str
    call_prefix: str
    call_suffix: str
    arguments_key: str
    markers: tuple[str, ...]

    def format_call(self, name: str, arguments: Mapping[str, object] | str) -> str:
        """The text of one call in this syntax (``arguments``: a dict, or JSON text kept verbatim if valid)."""
        if isinstance(arguments, str):
            parsed = _loads(arguments)
            arguments = parsed if parsed is not None else arguments
        return self.call_prefix + json.dumps({"name": name, self.arguments_key: arguments},
                                             ensure_ascii=False) + self.call_suffix

    def split(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        """``(content, tool_calls)``: the text without the parsed calls (stripped), and the calls.

        When nothing parses, the content is ``text`` unchanged (not stripped).
        """
        if self.name == "llama3_json":
            return _split_llama3(text)
        if self.name == "mistral":
            return _split_mistral(text)
        return _split_hermes(text)

    def parse(self, text: str) -> list[dict[str, Any]]:
        """Only the OpenAI-shaped tool calls found in ``text`` (possibly empty)."""
        return self.split(text)[1]


_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)


def _split_hermes(text: str) -> tuple[str, list[dict[str, Any]]]:
    calls: list[dict[str, Any]] = []
    pieces: list[str] = []
    pos = 0
    for m in _BLOCK.finditer(text):
        call = _to_call(_loads(m.group(1).strip()))
        if call is None:
            continue
        calls.append(call)
        pieces.append(text[pos : m.start()])
        pos = m.end()
    if not calls:
        return text, []
    pieces.append(text[pos:])
    return "".join(pieces).strip(), calls


_PYTHON_TAG = "<|python_tag|>"


def _split_llama3(text: str) -> tuple[str, list[dict[str, Any]]]:
    body = text.strip()
    body = body.removeprefix(_PYTHON_TAG).strip()
    if not body.startswith("{"):
        return text, []
    decoder = json.JSONDecoder()
    calls, pos = [], 0
    while pos < len(body):
        try:
            obj, end = decoder.raw_decode(body, pos)
        except (ValueError, RecursionError):
            return text, []
        call = _to_call(obj)
        if call is None:
            return text, []
        calls.append(call)
        rest = body[end:].lstrip()
        if not rest:
            break
        if not rest.startswith(";"):
            return text, []  # trailing prose: not a (pure) tool-call reply
        rest = rest[1:].lstrip()
        pos = len(body) - len(rest)
    return "", calls


_MISTRAL = "[TOOL_CALLS]"


def _split_mistral(text: str) -> tuple[str, list[dict[str, Any]]]:
    at = text.find(_MISTRAL)
    if at < 0:
        return text, []
    try:
        objs, end = json.JSONDecoder().raw_decode(text[at + len(_MISTRAL):].lstrip())
    except (ValueError, RecursionError):
        return text, []
    objs = objs if isinstance(objs, list) else [objs]
    calls = [_to_call(o) for o in objs]
    if not calls or any(c is None for c in calls):
        return text, []
    return text[:at].strip(), [c for c in calls if c is not None]


TOOL_PARSERS: dict[str, ToolParser] = {
    "hermes": ToolParser("hermes", "<tool_call>\n", "\n</tool_call>", "arguments", (TOOL_CALL_OPEN,)),
    # a reply that starts with "{" may be a call: streamed text is held back from the first "{"
    "llama3_json": ToolParser("llama3_json", "", "", "parameters", (_PYTHON_TAG, "{")),
    "mistral": ToolParser("mistral", "[TOOL_CALLS] [", "]", "arguments", (_MISTRAL,)),
}
_ALIASES = {"qwen": "hermes", "qwen25": "hermes", "qwen3": "hermes", "llama3": "llama3_json", "llama": "llama3_json"}


def get_tool_parser(name: str | None) -> ToolParser:
    """The parser called ``name`` (vLLM's names: ``hermes``, ``llama3_json``, ``mistral``); None: hermes."""
    key = _ALIASES.get(name or "hermes", name or "hermes")
    if key not in TOOL_PARSERS:
        raise ValidationError(f"model.tool_parser: unknown parser {name!r}; choose one of {sorted(TOOL_PARSERS)}")
    return TOOL_PARSERS[key]


def split_tool_calls(text: str, parser: ToolParser | None = None) -> tuple[str, list[dict[str, Any]]]:
    """``(content, tool_calls)`` with ``parser`` (default hermes); see :meth:`ToolParser.split`."""
    return (parser or TOOL_PARSERS["hermes"]).split(text)


