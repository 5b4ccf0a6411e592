"""Chat-template families shipped with swarmpool: the template text, its control tokens, its tool parser.

A family is what a model config needs to speak one chat format: ``chat_template`` (a jinja file
in this folder), the tool-call parser that reads the model's calls (``model.tool_parser``), the
control tokens the template writes (a tokenizer must know them as special tokens for the
template's turns to be single tokens) and the token that ends an assistant turn.

- ``chatml`` (``tiny_chatml``): the tiny model's own ChatML; ``tool`` turns.
- ``qwen2.5`` (``chatml_qwen``): Qwen2.5-Instruct style, ``<tool_call>`` blocks (hermes).
- ``smollm2`` (``chatml_qwen`` with SmolLM2's default system prompt): SmolLM2-Instruct's own template
  is ChatML without tools and without list content; this one renders the same text for plain chats
  and adds hermes tools.
- ``qwen3`` (``qwen3``): Qwen3 style; ``<think>`` reasoning is dropped from the history.
- ``llama3`` (``llama3_json``): Llama-3.1 style headers and JSON tool calls.
- ``mistral`` (``mistral``): Mistral-v3 style ``[INST]``, ``[TOOL_CALLS]``, ``[TOOL_RESULTS]``.

These are our own templates in the style of each family, tolerant of what agent frameworks
send (content None or a list of parts, arguments as invalid JSON text) and prefix-stable (an
earlier turn renders the same whatever follows), which the gateway's prefix-consistent
tokenization relies on. Not here: downloading or copying a vendor's template.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from swarm.errors import ValidationError
from swarm.policy.toolcalls import ToolParser, get_tool_parser

__all__ = ["TemplateFamily", "FAMILIES", "get_family", "family_of", "parser_for", "TEMPLATES_DIR"]

TEMPLATES_DIR = Path(__file__).parent


@dataclass(frozen=True)
class TemplateFamily:
    """One chat format: template file stem, tool parser name, control tokens, end-of-turn token."""

    name: str
    template: str
    tool_parser: str
    special_tokens: tuple[str, ...]
    end_of_turn: str
    reasoning: bool = False  # replies may open with a <think>...</think> block
    default_system: str | None = None  # replaces the template's `set default_system` line (chatml_qwen)

    def text(self) -> str:
        """The template's jinja source (with this family's default system prompt, if it sets one)."""
        text = (TEMPLATES_DIR / f"{self.template}.jinja").read_text()
        if self.default_system is None:
            return text
        start = text.index("{%- set default_system = ")
        end = text.index("-%}", start) + 3
        return text[:start] + "{%- set default_system = " + json.dumps(self.default_system) + " -%}" + text[end:]


FAMILIES: dict[str, TemplateFamily] = {f.name: f for f in (
    TemplateFamily("chatml", "tiny_chatml", "hermes", ("<|im_start|>", "<|im_end|>"), "<|im_end|>"),
    TemplateFamily("qwen2.5", "chatml_qwen", "hermes", ("<|im_start|>", "<|im_end|>"), "<|im_end|>"),
    TemplateFamily("smollm2", "chatml_qwen", "hermes", ("<|im_start|>", "<|im_end|>"), "<|im_end|>",
                   default_system="You are a helpful AI assistant named SmolLM, trained by Hugging Face"),
    TemplateFamily("qwen3", "qwen3", "hermes", ("<|im_start|>", "<|im_end|>", "<think>", "</think>"), "<|im_end|>",
                   reasoning=True),
    TemplateFamily("llama3", "llama3_json", "llama3_json",
                   ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                    "<|python_tag|>"), "<|eot_id|>"),
    TemplateFamily("mistral", "mistral", "mistral",
                   ("<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_CALLS]",
                    "[TOOL_RESULTS]", "[/TOOL_RESULTS]"), "</s>"),
)}


def get_family(name: str) -> TemplateFamily:
    """The family called ``name``; the error lists the known ones."""
    if name not in FAMILIES:
        raise ValidationError(f"unknown chat-template family {name!r}; choose one of {sorted(FAMILIES)}")
    return FAMILIES[name]


def family_of(chat_template: str | None) -> TemplateFamily | None:
    """The family a ``chat_template`` setting names (a family name or a shipped template's stem), if any."""
    if not chat_template or "{" in chat_template:
        return None
    name = chat_template.removesuffix(".jinja")
    return FAMILIES.get(name) or next((f for f in FAMILIES.values() if f.template == name), None)


def parser_for(tool_parser: str | None, chat_template: str | None = None) -> ToolParser:
    """``model.tool_parser`` if set, else the parser of the family ``chat_template`` names, else hermes."""
    if tool_parser:
        return get_tool_parser(tool_parser)
    family = family_of(chat_template)
    return get_tool_parser(family.tool_parser if family else None)
