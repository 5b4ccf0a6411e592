"""Reward of the echo task: how close the reply is to the asked word, by characters.

Dense on purpose: a tiny model that gets a few letters right is rewarded a little, so GRPO
has variance to learn from long before replies are exactly right.
"""

from __future__ import annotations

import difflib

__all__ = ["echo_reward"]


def echo_reward(reply: str | None, word: str) -> dict[str, float]:
    """``{"reward", "exact", "similarity"}``; reward = similarity in [0, 1], 1.0 only for the exact word."""
    text = (reply or "").strip().strip(".!\"'").strip().lower()
    exact = float(text == word)
    similarity = 1.0 if exact else difflib.SequenceMatcher(None, text, word).ratio()
    return {"reward": similarity, "exact": exact, "similarity": similarity}
