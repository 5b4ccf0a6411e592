"""Human feedback as training signal: the rating rules and correction items, as pure functions.

Ratings (``POST /v1/feedback`` ``rating``) are first mapped linearly from the raters' scale
``[rating_min, rating_max]`` onto the reward scale ``[reward_min, reward_max]`` (clamped), then
combined with the task reward by one :class:`RatingRule` mode:

- ``ignore``: ratings change nothing (the default).
- ``replace``: a rated step's reward is its mapped rating.
- ``weighted``: ``(1 - weight) * task reward + weight * mapped rating`` (the rating alone where the
  task gave none).
- ``fill``: the mapped rating only where the task gave no reward. Such steps are not leasable (the
  trainer leases final rewards only), so the pool side writes these rewards before the lease
  (:func:`fill_rewards` says which, ``swarm.update`` writes them).

A step's rating is the mean of the ratings on the step itself, else the mean of those on its
episode (:func:`step_ratings`).

A correction becomes a :class:`~swarm.merge.TrainSeq` (:func:`correction_items`): the corrected
step's exact prompt ids, the correction's exact ids as the response, no behaviour logprobs (the
loss treats it as on-policy, ratio 1) and advantage ``weight``. PPO-clip's gradient at ratio 1 is
``weight * grad log pi(correction | prompt)`` per token (the SFT gradient, with the batch's token
weights), and the item merges with the batch's shared prefixes. Nothing here reads the pool, a
config or a model.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from swarm.errors import ValidationError
from swarm.merge.items import TrainSeq
from swarm.pool.feedback import Correction, Rating
from swarm.records import Step

__all__ = ["RatingMode", "RatingRule", "rating_reward", "step_ratings", "rated_rewards", "fill_rewards",
           "correction_items", "MODES"]

RatingMode = Literal["ignore", "replace", "weighted", "fill"]
MODES = ("ignore", "replace", "weighted", "fill")


@dataclass(frozen=True)
class RatingRule:
    """How ratings combine into rewards (see the module docstring); validated on construction."""

    mode: RatingMode = "ignore"
    weight: float = 0.5
    rating_min: float = 0.0
    rating_max: float = 1.0
    reward_min: float = 0.0
    reward_max: float = 1.0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValidationError(f"feedback.rating must be one of {list(MODES)}, got {self.mode!r}")
        if not 0.0 <= self.weight <= 1.0:
            raise ValidationError(f"feedback.rating_weight must be in [0, 1], got {self.weight}")
        if not self.rating_min < self.rating_max:
            raise ValidationError(f"feedback.rating_scale must be [min, max] with min < max, got "
                                  f"[{self.rating_min}, {self.rating_max}]")
        if not all(math.isfinite(x) for x in (self.rating_min, self.rating_max, self.reward_min, self.reward_max)):
            raise ValidationError("feedback.rating_scale / reward_scale must be finite")


def rating_reward(rating: float, rule: RatingRule) -> float:
    """``rating`` on the raters' scale mapped linearly (and clamped) onto the reward scale."""
    x = (min(max(float(rating), rule.rating_min), rule.rating_max) - rule.rating_min) / (rule.rating_max - rule.rating_min)
    return rule.reward_min + x * (rule.reward_max - rule.reward_min)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def step_ratings(steps: Sequence[Step], ratings: Iterable[Rating]) -> list[float | None]:
    """Per step: the mean of its own ratings, else of its episode's ratings, else None."""
    own: dict[str, list[float]] = defaultdict(list)
    episode: dict[str, list[float]] = defaultdict(list)
    for r in ratings:
        (own[r.step_id] if r.step_id is not None else episode[r.episode_id]).append(r.rating)
    return [_mean(own[s.step_id]) if own.get(s.step_id) else
            (_mean(episode[s.episode_id]) if episode.get(s.episode_id) else None) for s in steps]


def rated_rewards(rewards: Sequence[float | None], ratings: Sequence[float | None],
                  rule: RatingRule) -> list[float | None]:
    """Each reward after the rule, given each step's rating (None: unrated, the reward is kept)."""
    if len(rewards) != len(ratings):
        raise ValidationError(f"{len(rewards)} rewards but {len(ratings)} ratings")
    out: list[float | None] = []
    for r, q in zip(rewards, ratings, strict=True):
        if q is None or rule.mode == "ignore":
            out.append(r)
            continue
        m = rating_reward(q, rule)
        if rule.mode == "replace" or r is None:
            out.append(m)
        elif rule.mode == "weighted":
            out.append((1.0 - rule.weight) * float(r) + rule.weight * m)
        else:  # fill: the task's reward stands
            out.append(r)
    return out


def fill_rewards(ratings: Iterable[Rating], rule: RatingRule) -> list[tuple[str, str, float, str]]:
    """Under ``fill``: ``(target kind "step" | "episode", target id, reward, source)`` per rated target
    without a reward (``ratings`` are those :meth:`Pool.unrewarded_ratings` returns); the mean rating,
    mapped, with the highest source among its raters. Other modes: nothing."""
    if rule.mode != "fill":
        return []
    by: dict[tuple[str, str], list[Rating]] = defaultdict(list)
    for r in ratings:
        by[("step", r.step_id) if r.step_id is not None else ("episode", r.episode_id)].append(r)
    rank = {"agent": 1, "judge": 2, "admin": 3}
    return [(kind, tid, rating_reward(_mean([r.rating for r in rs]), rule),
             max((r.source for r in rs), key=lambda s: rank.get(s, 0)))
            for (kind, tid), rs in by.items()]


def correction_items(corrections: Iterable[Correction], weight: float, version: int = 0) -> list[TrainSeq]:
    """One supervised item per correction: exact prompt and correction ids, on-policy, advantage ``weight``."""
    if not (math.isfinite(weight) and weight >= 0):
        raise ValidationError(f"feedback.correction_weight must be finite and >= 0, got {weight}")
    return [TrainSeq(step_id=c.event_id, prompt_ids=c.prompt_ids, response_ids=c.response_ids,
                     behaviour_logprobs=None, advantage=float(weight), episode_id=c.episode_id,
                     policy_version=int(version)) for c in corrections]
