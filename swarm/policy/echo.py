"""EchoBackend: a null inference backend that answers instantly, for gateway benchmarks and fast tests.

It implements :class:`~swarm.policy.base.PolicyBackend` with a byte-level "tokenizer" (ids 0-255
are bytes, a few ChatML special tokens follow) and a ChatML-like chat template, so the gateway's
tokenization, prefix and storage paths run for real while the "model" costs nothing.

Replies are deterministic functions of the prompt text:

- by default it echoes the content of the last user (or tool) turn, truncated to ``max_tokens``;
  with ``reply="..."`` it always answers that text;
- when tools are given and the last turn is a user turn, it calls the first tool with
  ``{"input": <that user text>}`` (so a tool loop is user -> tool call -> tool result -> echo).

With ``family="llama3"`` (or ``qwen3``, ``mistral``, ...; see :mod:`swarm.policy.templates`) it
speaks that chat-template family instead: the family's jinja template renders the prompt, its
control tokens are single ids, its end-of-turn token closes each reply, tool calls are written in
its tool-call syntax and parsed back with its parser, and a reasoning family (qwen3) opens every
reply with a short ``<think>`` block that the template drops from the history.

Every sampled token gets logprob 0.0 (the "distribution" is a point mass). It does not sample,
batch, train or load weights (``load_weights`` only bumps the version).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import AsyncIterator
from typing import Any

from swarm.errors import ContextLengthError
from swarm.lora import LoraSpec
from swarm.policy.base import GenerateRequest, Generation, StateDict, TokenDelta, VersionTable
from swarm.policy.settings import BACKENDS, BackendSection
from swarm.policy.templates import get_family
from swarm.policy.textguard import guard_chat, split_guarded
from swarm.policy.toolcalls import TOOL_CALL_OPEN, get_tool_parser
from swarm.settings import derive

__all__ = ["EchoBackend", "SPECIAL_TOKENS"]

SPECIAL_TOKENS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
_TURN_RE = re.compile(r"<\|im_start\|>(\w+)\n(.*?)(?:<\|im_end\|>|$)", re.S)
EOS = "<|im_end|>"
THINK = "<think>\nechoing the last turn\n</think>\n\n"


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def _tool_call_text(call: dict[str, Any]) -> str:
    fn = call.get("function", call)
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            pass  # invalid JSON sent back by a client: render it verbatim, never fail
    return ("<tool_call>\n" + json.dumps({"name": fn.get("name", ""), "arguments": args}, ensure_ascii=False)
            + "\n</tool_call>")


class EchoBackend(VersionTable):
    """A PolicyBackend that replies instantly and deterministically (see the module docstring)."""

    def __init__(
        self,
        policies: list[str] | tuple[str, ...] = ("default",),
        reply: str | None = None,
        max_context: int = 4096,
        delay_s: float = 0.0,
        family: str | None = None,
    ) -> None:
        self._versions = {p: 0 for p in policies}
        self._reply = reply
        self._max_context = max_context
        self._delay_s = delay_s
        self._family = None if family is None else get_family(family)
        self._parser = None if self._family is None else get_tool_parser(self._family.tool_parser)
        specials = SPECIAL_TOKENS if self._family is None else tuple(
            t for t in self._family.special_tokens if t not in ("<think>", "</think>"))  # those decode as text
        self._special_ids = {tok: 256 + i for i, tok in enumerate(specials)}
        self._id_special = {i: tok for tok, i in self._special_ids.items()}
        self._special_re = re.compile("(" + "|".join(re.escape(t) for t in specials) + ")")
        self._eos = EOS if self._family is None else self._family.end_of_turn

    # -- PolicyBackend: metadata -------------------------------------------------------------
    def tool_call_markers(self, policy: str) -> tuple[str, ...]:
        """Where this policy's tool-call syntax starts: streamed text is held back from there."""
        return self._parser.markers if self._parser is not None else (TOOL_CALL_OPEN,)

    def max_context(self, policy: str) -> int:
        self._check_policy(policy)
        return self._max_context

    def load_weights(self, policy: str, adapter_state: StateDict | None, version: int) -> None:
        self._check_policy(policy)
        self._versions[policy] = version

    # -- PolicyBackend: text <-> ids ---------------------------------------------------------
    def render_chat(
        self,
        policy: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
    ) -> str:
        # client text stays text, for every family (the family's own control tokens included)
        messages, tools = guard_chat(messages, tools, tuple(self._special_ids))
        if self._family is not None:
            from transformers.utils.chat_template_utils import render_jinja_template

            rendered, _ = render_jinja_template([messages], tools=tools or None, chat_template=self._family.text(),
                                                add_generation_prompt=add_generation_prompt)
            return rendered[0]
        parts: list[str] = []
        if tools:
            parts.append("<|im_start|>system\n# Tools\n" + json.dumps(tools, sort_keys=True, ensure_ascii=False)
                         + "<|im_end|>\n")
        for m in messages:
            role = m.get("role", "user")
            text = _content_text(m.get("content"))
            calls = m.get("tool_calls") or []
            if calls:
                text += ("\n" if text else "") + "\n".join(_tool_call_text(c) for c in calls)
            parts.append(f"<|im_start|>{role}\n{text}<|im_end|>\n")
        if add_generation_prompt:
            parts.append("<|im_start|>assistant\n")
        return "".join(parts)

    def encode(self, policy: str, text: str) -> list[int]:
        ids: list[int] = []
        for chunk, literal in split_guarded(text):
            if literal:  # guarded client text: bytes, even where it spells a control token
                ids.extend(chunk.encode("utf-8"))
                continue
            for piece in self._special_re.split(chunk):
                if piece in self._special_ids:
                    ids.append(self._special_ids[piece])
                elif piece:
                    ids.extend(piece.encode("utf-8"))
        return ids

    def vocab_size(self, policy: str) -> int:
        """Token ids are bytes (0-255) and the special tokens after them."""
        self._check_policy(policy)
        return 256 + len(self._special_ids)

    def decode(self, policy: str, ids: list[int]) -> str:
        out: list[str] = []
        buf = bytearray()
        for i in ids:
            if i in self._id_special:
                out.append(buf.decode("utf-8", errors="replace"))
                buf.clear()
                out.append(self._id_special[i])
            else:
                buf.append(i & 0xFF)
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)

    # -- PolicyBackend: generation -----------------------------------------------------------
    def _prompt_ids(self, request: GenerateRequest) -> list[int]:
        self._check_policy(request.policy)
        if request.prompt_ids is not None:
            ids = list(request.prompt_ids)
        else:
            ids = self.encode(request.policy, self.render_chat(request.policy, request.messages or [], request.tools, True))
        if len(ids) + request.sampling.max_tokens > self._max_context:
            raise ContextLengthError(
                f"prompt ({len(ids)} tokens) + max_tokens ({request.sampling.max_tokens}) exceeds the "
                f"context of {self._max_context}",
                policy=request.policy,
            )
        return ids

    def _complete(self, request: GenerateRequest, prompt_ids: list[int]) -> Generation:
        policy, max_tokens = request.policy, request.sampling.max_tokens
        if request.messages is not None:
            turns = [(m.get("role", "user"), _content_text(m.get("content"))) for m in request.messages
                     if m.get("role") != "assistant"]
        else:
            turns = [t for t in _TURN_RE.findall(self.decode(policy, prompt_ids)) if t[0] != "assistant"]
        last_role, last_text = turns[-1] if turns else ("user", "")
        tool_calls: list[dict[str, Any]] = []
        if request.tools and last_role == "user" and self._reply is None:
            fn = request.tools[0].get("function", request.tools[0])
            call_id = "call_" + hashlib.sha1(bytes(str(prompt_ids), "ascii")).hexdigest()[:16]
            args = json.dumps({"input": last_text})
            tool_calls = [{"id": call_id, "type": "function", "function": {"name": fn.get("name", "tool"), "arguments": args}}]
            body = (_tool_call_text(tool_calls[0]) if self._parser is None
                    else self._parser.format_call(fn.get("name", "tool"), {"input": last_text}))
            content = ""
        else:
            body = content = self._reply if self._reply is not None else last_text
        if self._family is not None and self._family.reasoning:
            body = THINK + body
            content = THINK + content if content or not tool_calls else content
        for s in request.sampling.stop:
            if s and s in body and not tool_calls:
                body = content = body[: body.index(s)]
        ids = self.encode(policy, body)
        finish = "tool_calls" if tool_calls else "stop"
        if len(ids) + 1 > max_tokens:
            ids, tool_calls, finish = ids[:max_tokens], [], "length"
            content = self.decode(policy, ids)
        else:
            ids = ids + [self._special_ids[self._eos]]
        return Generation(prompt_ids=prompt_ids, response_ids=ids, logprobs=[0.0] * len(ids), text=content,
                          tool_calls=tool_calls, finish_reason=finish, policy_version=self._versions[policy])

    async def generate(self, request: GenerateRequest) -> list[Generation]:
        prompt_ids = self._prompt_ids(request)
        if self._delay_s:
            await asyncio.sleep(self._delay_s)
        gen = self._complete(request, prompt_ids)
        return [gen for _ in range(request.sampling.n)]

    async def stream(self, request: GenerateRequest) -> AsyncIterator[TokenDelta | Generation]:
        prompt_ids = self._prompt_ids(request)
        gen = self._complete(request, prompt_ids)
        for index in range(request.sampling.n):
            pending: list[int] = []
            sent = ""
            for pos, tid in enumerate(gen.response_ids):
                if self._delay_s:
                    await asyncio.sleep(self._delay_s / max(1, len(gen.response_ids)))
                pending.append(tid)
                # emit text only once its UTF-8 bytes are complete; special tokens are not content
                text = self.decode(request.policy, [t for t in gen.response_ids[: pos + 1] if t < 256])
                last = pos == len(gen.response_ids) - 1
                if text.endswith("\ufffd") and not last:
                    continue
                delta = "" if gen.tool_calls else text[len(sent) :]
                sent = text
                yield TokenDelta(index=index, token_ids=pending, logprobs=[0.0] * len(pending), text=delta)
                pending = []
            yield gen


@BACKENDS.declare("echo")
class EchoSettings(derive(EchoBackend, skip=("policies",), base=BackendSection)):  # type: ignore[misc]
    """``backend: echo``: the null backend (benchmarks, fast tests)."""

    def build(self, policies: list[str], lora: LoraSpec | None) -> EchoBackend:
        return EchoBackend(list(policies), **self.args())
