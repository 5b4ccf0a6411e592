"""Reward of the ``math`` task: is the final number right, plus a small bonus for using the tool well.

``math_reward(final_text, answer, tool_ok, tool_errors, tool_calls)`` returns
``{"reward", "correct", "answered", "tool_ok", "tool_errors", "tool_calls"}`` where

    reward = 1.0 * correct + TOOL_BONUS * (tool_ok > 0)      # TOOL_BONUS = 0.1

so a correct answer scores 1.0 (1.1 with at least one well-formed calculator call), a wrong
answer after a well-formed call 0.1, anything else 0.0. A well-formed call is one whose
arguments are a JSON object with an ``expression`` that evaluates (see
:func:`experiments.math.calculator.run_calculator`). The bonus is small and does not depend on
the number of calls, so spamming the tool is not rewarded. Malformed calls are counted in
``tool_errors`` for logging only; they are not penalised beyond the missing bonus.

The final number is read robustly (:func:`parse_final_number`): ``\\boxed{..}`` first, then
the number after the last "answer" marker, then the last number in the text; thousands
separators and a trailing ``.0`` are accepted.
"""

from __future__ import annotations

import re

__all__ = ["TOOL_BONUS", "parse_final_number", "math_reward"]

TOOL_BONUS = 0.1

_NUM = r"[-−]?\d[\d,]*(?:\.\d+)?"
_BOXED = re.compile(r"\\boxed\{\s*(" + _NUM + r")\s*\}")
_MARKED = re.compile(r"answer\s*(?:is|:|=)?\s*[:=]?\s*\**\s*(" + _NUM + ")", re.I)
_ANY = re.compile(_NUM)


def _to_float(text: str) -> float | None:
    try:
        return float(text.replace(",", "").replace("−", "-"))
    except ValueError:
        return None


def parse_final_number(text: str | None) -> float | None:
    """The final numeric answer in a reply, or None when it has no number."""
    if not text:
        return None
    for pattern in (_BOXED, _MARKED):
        found = pattern.findall(text)
        if found:
            return _to_float(found[-1])
    found = _ANY.findall(text)
    return _to_float(found[-1].rstrip(",")) if found else None


def math_reward(final_text: str | None, answer: float, tool_ok: int = 0, tool_errors: int = 0,
                tool_calls: int = 0) -> dict[str, float]:
    """Score one episode (see the module docstring for the formula)."""
    value = parse_final_number(final_text)
    correct = float(value is not None and abs(value - answer) < 1e-6)
    bonus = TOOL_BONUS if tool_ok > 0 else 0.0
    return {"reward": correct + bonus, "correct": correct, "answered": float(value is not None),
            "tool_ok": float(tool_ok), "tool_errors": float(tool_errors), "tool_calls": float(tool_calls)}
