"""What the merge and the trainer consume: one trainable step as plain token sequences.

A :class:`TrainSeq` is a step reduced to what training needs: the exact prompt ids, the exact
response ids, the logprobs they were sampled with (the behaviour policy), the step's
advantage and ids for bookkeeping. It is built from a :class:`swarm.records.Step` with
:meth:`TrainSeq.from_step`. It does not compute advantages (see ``swarm.train.advantages``)
and holds no tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from swarm.errors import ValidationError
from swarm.records import Step

__all__ = ["TrainSeq"]


@dataclass(frozen=True)
class TrainSeq:
    """One step to train on: its response tokens are the trainable targets.

    ``behaviour_logprobs`` may be ``None`` (a source that recorded none); the loss then treats
    the step as on-policy (behaviour = the current policy, detached). ``constraint``: the grammar
    record the response was sampled under (``Step.metadata["constraint"]``), None for free text;
    the trainer scores those tokens under the same masks (``swarm.train.constraint``).
    """

    step_id: str
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    behaviour_logprobs: tuple[float, ...] | None = None
    advantage: float = 0.0
    episode_id: str = ""
    policy_version: int = 0
    constraint: dict[str, Any] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_ids", tuple(int(t) for t in self.prompt_ids))
        object.__setattr__(self, "response_ids", tuple(int(t) for t in self.response_ids))
        if self.behaviour_logprobs is not None:
            object.__setattr__(self, "behaviour_logprobs", tuple(float(x) for x in self.behaviour_logprobs))
            if len(self.behaviour_logprobs) != len(self.response_ids):
                raise ValidationError(
                    f"behaviour_logprobs has {len(self.behaviour_logprobs)} entries but response_ids has "
                    f"{len(self.response_ids)}",
                    step_id=self.step_id,
                )
        if not math.isfinite(self.advantage):
            raise ValidationError(f"advantage must be finite, got {self.advantage!r}", step_id=self.step_id)
        if any(t < 0 for t in self.prompt_ids) or any(t < 0 for t in self.response_ids):
            raise ValidationError("token ids must be >= 0", step_id=self.step_id)

    @property
    def tokens(self) -> tuple[int, ...]:
        """The full sequence: prompt then response."""
        return self.prompt_ids + self.response_ids

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def n_targets(self) -> int:
        """Response tokens that can be scored (a first token with no prompt before it cannot)."""
        return len(self.response_ids) - (1 if not self.prompt_ids and self.response_ids else 0)

    @classmethod
    def from_step(cls, step: Step, advantage: float) -> TrainSeq:
        """The step's exact token ids and sampling logprobs, with the advantage computed for it."""
        return cls(step_id=step.step_id, prompt_ids=tuple(step.prompt_ids), response_ids=tuple(step.response_ids),
                   behaviour_logprobs=None if step.response_logprobs is None else tuple(step.response_logprobs),
                   advantage=float(advantage), episode_id=step.episode_id, policy_version=step.policy_version,
                   constraint=step.metadata.get("constraint"))
