"""Constrained decoding: ``response_format`` / ``tool_choice`` -> a token grammar, with xgrammar.

A :class:`Constraint` says what a reply must match: a JSON object (``json_object``), a JSON
schema (``json_schema``, ``strict`` or not), or exactly one tool call (``tool_call``: one of the
offered tools, or a named one) written in the chat-template family's syntax
``call_prefix + {"name": ..., <arguments_key>: {...}} + call_suffix``. It is built from the
OpenAI request fields by :func:`request_constraint` and is plain data (:meth:`Constraint.to_record`).

:class:`Grammars` turns a constraint into an xgrammar grammar over one tokenizer and hands out
:class:`TokenMask` matchers: the allowed next tokens as a boolean vector, advanced token by
token. The backend samples from ``log_softmax`` of the logits with the disallowed tokens at
``-inf``; the trainer replays the same grammar over the stored response ids
(``swarm.train.constraint``) and scores under the same masks. :meth:`Grammars.record` is what a
step stores: the constraint plus everything the mask depends on (stop ids, vocabulary size,
JSON layout, library version), so the replay is exact.

Why xgrammar (``benchmarks/constraint_bench.py``, docs/policy.md): same compile time as
llguidance for a small enum schema and ~8x less CPU per token mask on the tiny tokenizer; it is
vLLM's default structured-output backend. Control tokens (the tokenizer's special tokens, except
the tool-call markers the grammar itself writes) are never allowed inside a reply; the stop
tokens are allowed only where the grammar may end.

Not here: sampling (``sampling.py``), the decode loop (``_decode.py``), HTTP parameter checks
(the gateway maps the :class:`~swarm.errors.ValidationError` raised here, whose ``param``
context names the request field, to a 400).
"""

from __future__ import annotations

import importlib.metadata
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from swarm.errors import ValidationError

if TYPE_CHECKING:  # xgrammar is imported where used: the gateway serves unconstrained calls without it
    import xgrammar
    from transformers import PreTrainedTokenizerBase

    from swarm.policy.toolcalls import ToolParser

__all__ = ["Constraint", "Grammars", "TokenMask", "request_constraint", "LIBRARY", "SEPARATORS",
           "TOOL_CALL_SEPARATORS", "TOOL_CALL_PREFIX", "TOOL_CALL_SUFFIX", "ARGUMENTS_KEY"]

try:
    LIBRARY = f"xgrammar {importlib.metadata.version('xgrammar')}"
except importlib.metadata.PackageNotFoundError:  # the gateway still serves unconstrained calls
    LIBRARY = "xgrammar (not installed)"
SEPARATORS = (",", ":")  # JSON replies: compact, fewer tokens to sample, no whitespace loops on small models
# tool calls: json.dumps' default, which is how chat templates re-render a call the client sends back,
# so the next turn's prompt stays a token prefix of this one (gateway/prefix.py)
TOOL_CALL_SEPARATORS = (", ", ": ")
# the Hermes / Qwen2.5 tool-call syntax (swarm/policy/toolcalls.py), used when a parser has no such fields
TOOL_CALL_PREFIX = "<tool_call>\n"
TOOL_CALL_SUFFIX = "\n</tool_call>"
ARGUMENTS_KEY = "arguments"
_KINDS = ("json_object", "json_schema", "tool_call")


@dataclass(frozen=True)
class Constraint:
    """What a reply must match. ``schema`` for json_schema; ``tools`` ((name, parameters) pairs) for tool_call."""

    kind: str
    schema: dict[str, Any] | None = None
    strict: bool = True
    name: str | None = None
    tools: tuple[tuple[str, dict[str, Any]], ...] = ()
    call_prefix: str = TOOL_CALL_PREFIX
    call_suffix: str = TOOL_CALL_SUFFIX
    arguments_key: str = ARGUMENTS_KEY
    separators: tuple[str, str] | None = None  # JSON item / key separators; None: the kind's default
    param: str = field(default="response_format", compare=False)  # the request field it came from

    def __post_init__(self) -> None:
        if self.separators is None:
            object.__setattr__(self, "separators", TOOL_CALL_SEPARATORS if self.kind == "tool_call" else SEPARATORS)
        object.__setattr__(self, "separators", tuple(self.separators))
        if self.kind not in _KINDS:
            raise ValidationError(f"unknown constraint kind {self.kind!r}; expected one of {_KINDS}", param=self.param)
        if self.kind == "json_schema" and not isinstance(self.schema, dict):
            raise ValidationError("a json_schema constraint needs a schema object", param=self.param)
        if self.kind == "tool_call" and not self.tools:
            raise ValidationError("a tool_call constraint needs at least one tool", param=self.param)

    def to_record(self) -> dict[str, Any]:
        """Plain JSON data; :meth:`from_record` gives the same constraint back.

        Schemas are stored as JSON *text*: the grammar follows the order of ``properties``, and a
        JSONB column (PostgreSQL) reorders object keys.
        """
        out: dict[str, Any] = {"kind": self.kind, "separators": list(self.separators)}
        if self.kind == "json_schema":
            out.update(schema=json.dumps(self.schema), strict=self.strict, name=self.name)
        elif self.kind == "tool_call":
            out.update(tools=[{"name": n, "parameters": json.dumps(p)} for n, p in self.tools],
                       call_prefix=self.call_prefix, call_suffix=self.call_suffix, arguments_key=self.arguments_key)
        return out

    def openai_fields(self) -> dict[str, Any]:
        """The OpenAI request fields that ask for this constraint (for servers that enforce them)."""
        if self.kind == "json_object":
            return {"response_format": {"type": "json_object"}}
        if self.kind == "json_schema":
            js = {"schema": self.schema, "strict": self.strict, **({"name": self.name} if self.name else {})}
            return {"response_format": {"type": "json_schema", "json_schema": js}}
        if len(self.tools) == 1:
            return {"tool_choice": {"type": "function", "function": {"name": self.tools[0][0]}}}
        return {"tool_choice": "required"}

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> Constraint:
        """The constraint of a stored record (raises ValidationError on a malformed one)."""
        if not isinstance(rec, dict) or not isinstance(rec.get("kind"), str):
            raise ValidationError("constraint record must be an object with a 'kind'", param="constraint")
        try:
            tools = tuple((str(t["name"]), _schema_of(t.get("parameters"))) for t in rec.get("tools") or ())
            schema = _schema_of(rec["schema"]) if rec.get("schema") is not None else None
            return cls(kind=rec["kind"], schema=schema, strict=bool(rec.get("strict", True)),
                       name=rec.get("name"), tools=tools,
                       call_prefix=str(rec.get("call_prefix", TOOL_CALL_PREFIX)),
                       call_suffix=str(rec.get("call_suffix", TOOL_CALL_SUFFIX)),
                       arguments_key=str(rec.get("arguments_key", ARGUMENTS_KEY)),
                       separators=tuple(str(x) for x in rec["separators"]) if rec.get("separators") else None,
                       param="constraint")
        except (KeyError, TypeError, ValueError) as e:
            raise ValidationError(f"malformed constraint record: {e}", param="constraint") from e


def _schema_of(value: Any) -> dict[str, Any]:
    """A schema stored as JSON text (or, from older records, as an object)."""
    out = json.loads(value) if isinstance(value, str) else value
    if not isinstance(out, dict):
        raise TypeError("a schema must be a JSON object")
    return out


# --------------------------------------------------------------------------- from OpenAI request fields
def _from_response_format(rf: Any) -> Constraint | None:
    if rf is None:
        return None
    if not isinstance(rf, dict) or not isinstance(rf.get("type"), str):
        raise ValidationError("response_format must be an object with a 'type'", param="response_format")
    kind = rf["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint("json_object")
    if kind == "json_schema":
        js = rf.get("json_schema")
        if not isinstance(js, dict):
            raise ValidationError("response_format.json_schema must be an object with a 'schema'",
                                  param="response_format.json_schema")
        schema = js.get("schema", {})  # OpenAI: a missing schema means any JSON object
        if not isinstance(schema, dict):
            raise ValidationError("response_format.json_schema.schema must be a JSON schema object",
                                  param="response_format.json_schema.schema")
        name = js.get("name")
        return Constraint("json_schema", schema=schema, strict=bool(js.get("strict") or False),
                          name=name if isinstance(name, str) else None)
    raise ValidationError(f"response_format type {kind!r} is not supported (text, json_object, json_schema)",
                          param="response_format.type")


def _tool(t: Any) -> tuple[str, dict[str, Any]]:
    fn = t.get("function") if isinstance(t, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise ValidationError("tools: each tool needs function.name", param="tools")
    params = fn.get("parameters")
    params = {"type": "object", "properties": {}} if params is None else params
    if not isinstance(params, dict):
        raise ValidationError(f"tools: function {fn['name']!r} has parameters that are not a JSON schema object",
                              param="tools")
    return fn["name"], params


def _from_tool_choice(tc: Any, tools: list[dict[str, Any]] | None, parser: Any) -> Constraint | None:
    if tc is None or tc in ("auto", "none"):
        return None
    if not tools:
        raise ValidationError("tool_choice requires tools", param="tool_choice")
    offered = [_tool(t) for t in tools]
    if tc == "required":
        chosen = offered
    elif isinstance(tc, dict):
        fn = tc.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if tc.get("type", "function") != "function" or not isinstance(name, str):
            raise ValidationError("tool_choice must be 'none', 'auto', 'required' or "
                                  "{'type': 'function', 'function': {'name': ...}}", param="tool_choice")
        chosen = [t for t in offered if t[0] == name]
        if not chosen:
            raise ValidationError(f"tool_choice names the function {name!r}, which is not in tools "
                                  f"({[t[0] for t in offered]})", param="tool_choice")
        chosen = chosen[:1]
    else:
        raise ValidationError(f"tool_choice {tc!r} is not supported", param="tool_choice")
    return Constraint("tool_call", tools=tuple(chosen), param="tool_choice",
                      call_prefix=getattr(parser, "call_prefix", TOOL_CALL_PREFIX),
                      call_suffix=getattr(parser, "call_suffix", TOOL_CALL_SUFFIX),
                      arguments_key=getattr(parser, "arguments_key", ARGUMENTS_KEY))


def request_constraint(response_format: object = None, tool_choice: object = None,
                       tools: list[dict[str, Any]] | None = None, parser: ToolParser | None = None
                       ) -> Constraint | None:
    """The constraint an OpenAI chat request asks for (None: free text).

    ``tool_choice`` ``required`` / named -> one tool call; ``auto`` / ``none`` -> no constraint.
    ``parser``: the chat-template family's tool-call parser (``call_prefix``, ``call_suffix``,
    ``arguments_key``; Hermes defaults when absent). Both a JSON ``response_format`` and a forcing
    ``tool_choice`` cannot hold at once: a ValidationError naming ``tool_choice``.
    """
    rf = _from_response_format(response_format)
    tc = _from_tool_choice(tool_choice, tools, parser)
    if rf is not None and tc is not None:
        raise ValidationError("tool_choice forcing a tool call cannot be combined with a JSON response_format",
                              param="tool_choice")
    return rf or tc


# --------------------------------------------------------------------------- grammars and masks
def _unpack(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """xgrammar's packed int32 bitmask (..., ceil(V/32)) -> bool (..., V)."""
    bits = (bitmask.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
    return bits.reshape(*bitmask.shape[:-1], -1)[..., :vocab].bool()


class TokenMask:
    """One reply's grammar state: which tokens may come next; advance with :meth:`accept`."""

    def __init__(self, matcher: xgrammar.GrammarMatcher, vocab: int) -> None:
        import xgrammar as xgr

        self._m = matcher
        self.vocab = vocab
        self._buf = xgr.allocate_token_bitmask(1, vocab)

    def allowed(self) -> torch.Tensor:
        """Bool ``(vocab,)``: True where the next token may be sampled."""
        self._m.fill_next_token_bitmask(self._buf)
        return _unpack(self._buf[0], self.vocab)

    def fill(self, bitmask: torch.Tensor, index: int) -> None:
        """Write the allowed next tokens into row ``index`` of a packed batch bitmask (xgrammar's int32 layout)."""
        self._m.fill_next_token_bitmask(bitmask, int(index))

    def accept(self, token: int) -> bool:
        """Advance past ``token``; False if the grammar does not allow it (the state is unchanged)."""
        return bool(self._m.accept_token(int(token)))

    @property
    def finished(self) -> bool:
        """The grammar accepted a stop token: nothing may follow."""
        return bool(self._m.is_terminated())


class Grammars:
    """Compiled grammars over one tokenizer (an LRU cache by constraint), and their matchers.

    ``vocab_size``: the model's logits width (may exceed the tokenizer's; extra ids are never
    allowed). ``stop_token_ids``: the tokens that end a reply, allowed once the grammar is complete.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, vocab_size: int, stop_token_ids: list[int] | set[int],
                 cache_size: int = 256) -> None:
        import xgrammar as xgr

        self.vocab_size = int(vocab_size)
        self.stop_token_ids = sorted(int(t) for t in stop_token_ids)
        self._tokenizer = tokenizer
        self._compiler_by_markers: dict[tuple[str, ...], xgrammar.GrammarCompiler] = {}
        self._cache: OrderedDict[str, xgrammar.CompiledGrammar] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self._xgr = xgr

    def _compiler(self, keep: tuple[str, ...]) -> Any:
        """A compiler whose vocabulary hides control tokens, except the texts in ``keep`` (tool-call markers)."""
        with self._lock:
            return self._compiler_locked(keep)

    def _compiler_locked(self, keep: tuple[str, ...]) -> Any:
        comp = self._compiler_by_markers.get(keep)
        if comp is None:
            xgr = self._xgr
            base = xgr.TokenizerInfo.from_huggingface(self._tokenizer, vocab_size=self.vocab_size,
                                                      stop_token_ids=self.stop_token_ids)
            control = _control_token_ids(self._tokenizer, keep)
            # an empty entry is a special token to xgrammar: never allowed inside a grammar
            vocab = [b"" if i in control else v for i, v in enumerate(base.decoded_vocab)]
            info = xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, vocab_size=self.vocab_size,
                                     stop_token_ids=self.stop_token_ids, add_prefix_space=base.add_prefix_space)
            comp = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
            self._compiler_by_markers[keep] = comp
        return comp

    def _grammar(self, c: Constraint) -> Any:
        xgr = self._xgr
        if c.kind == "json_object":
            # strict_mode would forbid every property of {"type": "object"}: any object is meant
            return xgr.Grammar.from_json_schema('{"type": "object"}', any_whitespace=False,
                                                separators=c.separators, strict_mode=False)
        if c.kind == "json_schema":
            return xgr.Grammar.from_json_schema(json.dumps(c.schema), any_whitespace=False, separators=c.separators,
                                                strict_mode=c.strict)
        from xgrammar.structural_tag import ConstStringFormat, StructuralTag

        def const(text: str) -> Any:
            return xgr.Grammar.from_structural_tag(StructuralTag(format=ConstStringFormat(value=text)))

        calls = []
        for name, params in c.tools:
            call_schema = {"type": "object", "properties": {"name": {"const": name}, c.arguments_key: params},
                           "required": ["name", c.arguments_key], "additionalProperties": False}
            body = xgr.Grammar.from_json_schema(json.dumps(call_schema), any_whitespace=False,
                                                separators=c.separators, strict_mode=True)
            calls.append(xgr.Grammar.concat(const(c.call_prefix), body, const(c.call_suffix)))
        return calls[0] if len(calls) == 1 else xgr.Grammar.union(*calls)

    def compile(self, c: Constraint) -> xgrammar.CompiledGrammar:
        """The compiled grammar (cached); a schema xgrammar refuses is a ValidationError naming ``c.param``."""
        key = json.dumps(c.to_record(), sort_keys=True)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        keep = tuple(s.strip() for s in (c.call_prefix, c.call_suffix) if s.strip()) if c.kind == "tool_call" else ()
        try:
            compiled = self._compiler(keep).compile_grammar(self._grammar(c))
        except (RuntimeError, ValueError, TypeError) as e:  # xgrammar reports bad schemas as these
            raise ValidationError(f"cannot build a grammar for {c.param}: {e}", param=c.param) from e
        with self._lock:
            self._cache[key] = compiled
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return compiled

    def ebnf(self, c: Constraint) -> str:
        """The grammar as xgrammar EBNF text (what a vLLM server with the xgrammar backend compiles the same way)."""
        return str(self._grammar(c))

    def matcher(self, c: Constraint) -> TokenMask:
        """A fresh :class:`TokenMask` at the start of a reply."""
        return TokenMask(self._xgr.GrammarMatcher(self.compile(c)), self.vocab_size)

    def record(self, c: Constraint) -> dict[str, Any]:
        """What a step stores: the constraint and everything its masks depend on."""
        return {**c.to_record(), "stop_token_ids": list(self.stop_token_ids), "vocab_size": self.vocab_size,
                "library": LIBRARY}

    def masks(self, c: Constraint, response_ids: list[int] | tuple[int, ...]) -> torch.Tensor:
        """Bool ``(len(response_ids), vocab)``: the allowed set before each response token (the replay)."""
        m = self.matcher(c)
        out = torch.zeros((len(response_ids), self.vocab_size), dtype=torch.bool)
        for k, tok in enumerate(response_ids):
            out[k] = m.allowed()
            if not m.accept(tok):
                raise ValidationError(f"response token {tok} at position {k} is not allowed by the step's "
                                      f"constraint ({c.kind})", param="constraint")
        return out


def _control_token_ids(tokenizer: Any, keep: tuple[str, ...]) -> set[int]:
    """Special tokens (chat-template control tokens) that a reply may not contain, except the texts in ``keep``."""
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    ids = {int(i) for i, t in added.items() if getattr(t, "special", False)}
    ids |= {int(i) for i in (getattr(tokenizer, "all_special_ids", None) or [])}
    return {i for i in ids if tokenizer.convert_ids_to_tokens(i) not in keep}
