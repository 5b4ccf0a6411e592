"""Chat rendering and tokenization with a local Hugging Face tokenizer, shared by the backends
that tokenize on this side (hf, vllm, upstream with a tokenizer). No generation here."""

from __future__ import annotations

from typing import Any

from swarm.errors import ValidationError

__all__ = ["LocalTokenizer"]


class LocalTokenizer:
    """``render_chat`` / ``encode`` / ``decode`` of the PolicyBackend protocol over a HF tokenizer.

    Subclasses implement :meth:`_tokenizer_for`, which checks the policy name and returns its
    tokenizer (raising the backend's own error when there is none).
    """

    def _tokenizer_for(self, policy: str) -> Any:
        raise NotImplementedError

    def render_chat(self, policy: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                    add_generation_prompt: bool) -> str:
        tok = self._tokenizer_for(policy)
        try:
            return tok.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                           add_generation_prompt=add_generation_prompt)
        except Exception as e:  # jinja raises many types; a bad message list is the caller's error
            raise ValidationError(f"messages: the chat template failed: {e}", policy=policy) from e

    def encode(self, policy: str, text: str) -> list[int]:
        """Text to ids, no special tokens added."""
        return list(self._tokenizer_for(policy).encode(text, add_special_tokens=False))

    def decode(self, policy: str, ids: list[int]) -> str:
        """Ids to text, special tokens kept."""
        return self._tokenizer_for(policy).decode(ids, skip_special_tokens=False)
