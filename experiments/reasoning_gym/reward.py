"""Reward of the reasoning_gym task: the generator's own ``score_answer``, on the extracted answer.

``gym_reward(reply, entry, dataset, answer_tags)`` returns ``{"reward", "score", "exact", "tagged",
"answered", "score_error"}`` where

    answer = the last <answer>...</answer> span of the reply (reasoning-gym's extract_answer);
             without one: the whole reply, stripped (or None when answer_tags is True)
    reward = score = dataset.score_answer(answer, entry)        # in [0, 1], the generator's verifier

``exact`` is 1 when the answer equals the entry's answer, ``tagged`` when the reply had the tags,
``answered`` when there was a non-empty answer to score. A verifier that raises on an odd answer
scores 0 with ``score_error`` 1 (a result, never a crash of the episode).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["extract_answer", "gym_reward"]

_TAGGED = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.S)


def extract_answer(reply: str | None, answer_tags: bool = False) -> tuple[str | None, bool]:
    """(answer or None, whether it came from <answer> tags), as reasoning-gym's extract_answer reads it."""
    text = reply or ""
    found = _TAGGED.findall(text)
    if found:
        return found[-1].strip(), True
    if answer_tags:
        return None, False
    stripped = text.strip()
    return (stripped or None), False


def gym_reward(reply: str | None, entry: dict[str, Any], dataset: Any, answer_tags: bool = False) -> dict[str, float]:
    """Score one reply to ``entry`` (see the module docstring for the formula and the parts)."""
    answer, tagged = extract_answer(reply, answer_tags)
    error = 0.0
    try:
        score = float(dataset.score_answer(answer, entry))
    except Exception:  # noqa: BLE001 - a generator's verifier failing on odd text is a zero, not a crash
        score, error = 0.0, 1.0
    score = min(1.0, max(0.0, score)) if score == score else 0.0  # NaN and out-of-range scores are clamped
    exact = float(answer is not None and answer == str(entry.get("answer")))
    return {"reward": score, "score": score, "exact": exact, "tagged": float(tagged),
            "answered": float(answer is not None), "score_error": error}
