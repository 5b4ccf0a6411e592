"""Chat rendering and tokenization with a local Hugging Face tokenizer, shared by the backends
that tokenize on this side (hf, vllm, upstream with a tokenizer). No generation here.

Client strings are guarded before the template runs (:mod:`swarm.policy.textguard`): a control
token's text inside message content, names, tool calls or tool definitions is tokenized as plain
text, so the prompt's control tokens come only from the template, whatever the template is.
"""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING, Any

from swarm.errors import ValidationError
from swarm.policy.base import GenerateRequest
from swarm.policy.textguard import guard_chat, split_guarded

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["LocalTokenizer", "control_texts", "TextEncoder"]


def control_texts(tok: PreTrainedTokenizerBase) -> list[str]:
    """The texts a tokenizer turns into added (control) tokens."""
    decoder = getattr(tok, "added_tokens_decoder", None) or {}
    texts = {str(getattr(t, "content", t)) for t in decoder.values()}
    texts.update(str(t) for t in (getattr(tok, "all_special_tokens", None) or []))
    return sorted(t for t in texts if t)


class TextEncoder:
    """Encodes a string as plain text: no added token is matched, whatever the string holds.

    Fast tokenizers: a copy of the Rust tokenizer without its added-token list (thread-safe,
    the shared tokenizer's state is never touched). Others: ``split_special_tokens=True``.
    """

    def __init__(self, tok: PreTrainedTokenizerBase) -> None:
        self._tok = tok
        self._raw = None
        raw = getattr(tok, "_tokenizer", None)
        if raw is not None and hasattr(raw, "to_str"):
            from tokenizers import Tokenizer

            spec = json.loads(raw.to_str())
            spec["added_tokens"] = []
            self._raw = Tokenizer.from_str(json.dumps(spec))
            self._raw.no_truncation()
            self._raw.no_padding()

    def encode(self, text: str) -> list[int]:
        if self._raw is not None:
            return list(self._raw.encode(text, add_special_tokens=False).ids)
        return list(self._tok.encode(text, add_special_tokens=False, split_special_tokens=True))


class LocalTokenizer:
    """``render_chat`` / ``encode`` / ``decode`` of the PolicyBackend protocol over a HF tokenizer.

    Subclasses implement :meth:`_tokenizer_for`, which checks the policy name and returns its
    tokenizer (raising the backend's own error when there is none).
    """

    _guards: dict[int, tuple[list[str], TextEncoder]]
    _guards_lock = threading.Lock()

    def _tokenizer_for(self, policy: str) -> PreTrainedTokenizerBase:
        raise NotImplementedError

    def _guard_for(self, tok: PreTrainedTokenizerBase) -> tuple[list[str], TextEncoder]:
        """(control-token texts, plain-text encoder) of a tokenizer, built once."""
        with self._guards_lock:
            if "_guards" not in self.__dict__:
                self._guards = {}
            got = self._guards.get(id(tok))
            if got is None:
                got = self._guards[id(tok)] = (control_texts(tok), TextEncoder(tok))
            return got

    def render_chat(self, policy: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                    add_generation_prompt: bool) -> str:
        """The template applied to ``messages``; control-token texts from the client come out guarded."""
        tok = self._tokenizer_for(policy)
        messages, tools = guard_chat(messages, tools, self._guard_for(tok)[0])
        try:
            return tok.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                           add_generation_prompt=add_generation_prompt)
        except Exception as e:  # jinja raises many types; a bad message list is the caller's error
            raise ValidationError(f"messages: the chat template failed: {e}", policy=policy) from e

    def encode(self, policy: str, text: str) -> list[int]:
        """Text to ids, no special tokens added; guarded spans (see render_chat) as plain text."""
        tok = self._tokenizer_for(policy)
        pieces = split_guarded(text)
        if len(pieces) == 1 and not pieces[0][1]:
            return list(tok.encode(text, add_special_tokens=False))
        plain = self._guard_for(tok)[1]
        ids: list[int] = []
        for piece, literal in pieces:
            ids.extend(plain.encode(piece) if literal else tok.encode(piece, add_special_tokens=False))
        return ids

    def request_ids(self, request: GenerateRequest) -> list[int]:
        """A request's prompt ids (given, or its messages rendered and encoded); never empty."""
        if request.prompt_ids is not None:
            ids = [int(i) for i in request.prompt_ids]
        elif request.messages is not None:
            ids = self.encode(request.policy, self.render_chat(request.policy, request.messages, request.tools, True))
        else:
            raise ValidationError("request needs messages or prompt_ids", policy=request.policy)
        if not ids:
            raise ValidationError("prompt_ids: the prompt is empty", policy=request.policy)
        return ids

    def decode(self, policy: str, ids: list[int]) -> str:
        """Ids to text, special tokens kept."""
        return self._tokenizer_for(policy).decode(ids, skip_special_tokens=False)

    def vocab_size(self, policy: str) -> int:
        """Token ids of this policy are in ``[0, vocab_size)``."""
        return len(self._tokenizer_for(policy))
