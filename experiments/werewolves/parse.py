"""Parse an LLM's reply into a werewolves :class:`~experiments.werewolves.game.Action`.

The first JSON object in the text is used (code fences and prose around it are ignored).
Minor variants are accepted: single quotes, trailing commas, Python ``True/False/None``;
key aliases (``act``/``type``/``move`` for ``action``; ``player``/``vote``/``kill``/``id`` for
``target``; ``speech``/``message``/``text``/``reason`` for ``say``); action synonyms
(``abstain``/``skip``/``none`` -> ``pass``, ``lynch``/``eliminate`` -> ``vote``, ``inspect``
-> ``check``, ...); targets as ``3``, ``"3"``, ``"player 3"`` or ``"P3"``; a missing action
when the decision has exactly one action taking a target (or only ``speak``).

:func:`parse_action` returns None when no usable object is found. It does not check
legality; the engine does, and replaces an illegal action by the fallback (counting a format
error).
"""

from __future__ import annotations

import json
import re
from typing import Any

from experiments.werewolves.game import Action, Decision

__all__ = ["extract_json", "parse_action"]

_SYNONYMS = {
    "pass": "pass", "abstain": "pass", "skip": "pass", "none": "pass", "no": "pass", "nothing": "pass",
    "vote": "vote", "lynch": "vote", "eliminate": "vote",
    "kill": "kill", "attack": "kill", "eat": "kill", "bite": "kill",
    "check": "check", "inspect": "check", "investigate": "check", "see": "check", "divine": "check",
    "save": "save", "heal": "save", "antidote": "save", "poison": "poison",
    "shoot": "shoot", "shot": "shoot",
    "speak": "speak", "say": "speak", "talk": "speak", "speech": "speak", "discuss": "speak",
}
_ACTION_KEYS = ("action", "act", "type", "move", "choice")
_TARGET_KEYS = ("target", "player", "target_id", "id", "vote", "kill", "check", "shoot", "poison")
_SAY_KEYS = ("say", "speech", "message", "text", "reason", "statement")
_TARGET_TEXT = re.compile(r"^\s*(?:player|p|#)?\s*(\d+)\s*$", re.I)


def _repair(text: str) -> str:
    text = re.sub(r",\s*([}\]])", r"\1", text)
    text = re.sub(r"\bTrue\b", "true", re.sub(r"\bFalse\b", "false", re.sub(r"\bNone\b", "null", text)))
    if '"' not in text:
        text = text.replace("'", '"')
    return text


def _balanced(text: str, start: int) -> str | None:
    """The ``{...}`` substring starting at ``start`` (brace matching, strings respected)."""
    depth, quote, escape = 0, "", False
    for i in range(start, len(text)):
        ch = text[i]
        if quote:
            escape = (ch == "\\") and not escape
            if ch == quote and not escape:
                quote = ""
            continue
        if ch in "\"'":
            quote = ch
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start:i + 1]
    return None


def extract_json(text: str | None) -> dict[str, Any] | None:
    """The first JSON object in ``text`` (tolerating the minor variants above), or None."""
    if not text:
        return None
    for m in re.finditer(r"\{", text):
        chunk = _balanced(text, m.start())
        if chunk is None:
            continue
        for candidate in (chunk, _repair(chunk)):
            try:
                obj = json.loads(candidate)
            except (ValueError, RecursionError):
                continue
            if isinstance(obj, dict):
                return obj
    return None


def _target(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        m = _TARGET_TEXT.match(value)
        return int(m.group(1)) if m else None
    return None


def parse_action(text: str | None, decision: Decision) -> Action | None:
    """The action in an LLM reply for ``decision``, or None when the reply has no usable JSON object."""
    obj = extract_json(text)
    if obj is None:
        return None
    low = {str(k).strip().lower(): v for k, v in obj.items()}
    raw = next((low[k] for k in _ACTION_KEYS if k in low), None)
    target_key = next((k for k in _TARGET_KEYS if k in low and low[k] is not None), None)
    target = _target(low[target_key]) if target_key else None
    say = next((low[k] for k in _SAY_KEYS if isinstance(low.get(k), str)), "")
    kind = _SYNONYMS.get(str(raw).strip().lower()) if isinstance(raw, str) else None
    if raw is None:  # no action key: infer it where the decision leaves one choice
        targeted = [a for a in decision.actions if a in ("vote", "kill", "check", "shoot", "poison")]
        if target_key in targeted:
            kind = target_key
        elif target is not None and len(targeted) == 1:
            kind = targeted[0]
        elif decision.actions == ("speak",) and say:
            kind = "speak"
    if kind is None:
        return None
    return Action(kind, target, say)
