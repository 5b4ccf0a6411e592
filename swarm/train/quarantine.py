"""Quarantine: leased steps the trainer cannot use are set aside with a reason, never a crash.

The gateway validates what it can at the door, but the pool may hold steps from older gateways,
other policies' vocabularies, direct ``Pool.add_steps`` callers or a changed model. Before an
update, :func:`usable` splits a batch into steps the model can take and the rest, each with its
reason (token id outside the embedding table, empty prompt, sequence longer than the model's
positions, logprobs that do not match the response). :func:`quarantine` labels the rest
``quarantined`` with ``exclude=True`` and the reason as the note, so they drop out of every
filter (and show, with the reason, in the dashboard's label views) and the update goes on.

It does not train or lease; the flow wires it between the lease and the update.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from swarm.pool import Annotator
from swarm.records import Step

__all__ = ["LABEL", "limits_of", "problem", "usable", "quarantine"]

LABEL = "quarantined"


def limits_of(model: Any) -> tuple[int, int | None]:
    """(vocabulary size, maximum sequence length or None) of a causal LM (peft-wrapped or not)."""
    vocab = int(model.get_input_embeddings().num_embeddings)
    cfg = getattr(model, "config", None)
    max_len = getattr(cfg, "max_position_embeddings", None)
    return vocab, (int(max_len) if isinstance(max_len, int) and max_len > 0 else None)


def problem(step: Step, vocab: int, max_len: int | None = None) -> str | None:
    """Why the trainer cannot use ``step``, or None when it can."""
    if not step.prompt_ids:
        return "empty prompt"
    for name in ("prompt_ids", "response_ids"):
        ids = getattr(step, name)
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            return f"{name} holds token id {bad}, outside the model's vocabulary [0, {vocab})"
    n = len(step.prompt_ids) + len(step.response_ids)
    if max_len is not None and n > max_len:
        return f"{n} tokens exceed the model's {max_len} positions"
    lp = step.response_logprobs
    if lp is not None:
        if len(lp) != len(step.response_ids):
            return f"{len(lp)} logprobs for {len(step.response_ids)} response tokens"
        if any(not math.isfinite(x) for x in lp):
            return "response_logprobs hold a non-finite value"
    if step.reward is not None and not math.isfinite(step.reward):
        return "reward is not finite"
    return None


def usable(steps: Sequence[Step], vocab: int, max_len: int | None = None) -> tuple[list[Step], dict[str, str]]:
    """(the steps the model can train on, {step_id: reason} for the others)."""
    good: list[Step] = []
    bad: dict[str, str] = {}
    for s in steps:
        why = problem(s, vocab, max_len)
        if why is None:
            good.append(s)
        else:
            bad[s.step_id] = why
    return good, bad


def quarantine(pool: Annotator, reasons: dict[str, str]) -> int:
    """Label each step ``quarantined`` (excluded) with its reason; returns how many."""
    for step_id, why in reasons.items():
        pool.label("step", step_id, LABEL, exclude=True, note=why)
    return len(reasons)
