"""Score constrained steps under the mask they were sampled with: replay the grammar over the response.

A step sampled under ``response_format`` / ``tool_choice`` stores its constraint record
(``metadata["constraint"]``, from :meth:`swarm.policy.constraint.Grammars.record`). The backend
sampled from ``log_softmax`` of the logits with the tokens the grammar forbade at ``-inf``, and
recorded that logprob. :class:`ConstraintReplay` rebuilds the same grammar over the trainer's
tokenizer, walks it over the stored response ids and returns, per response position, the
allowed-token set; :func:`target_allowed` lays those rows out for the targets of one collated
micro-batch, and ``target_logprobs(..., allowed=...)`` renormalises over them. So the PPO ratio
of a constrained step is exactly 1 at the policy version that produced it.

Does not sample, and does not decide which steps are trainable: a record that does not replay
(another vocabulary, a token the grammar refuses) is a ValidationError naming the step.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from swarm.errors import ValidationError
from swarm.merge.items import TrainSeq
from swarm.merge.tensors import Collated
from swarm.policy.constraint import LIBRARY, Constraint, Grammars

__all__ = ["ConstraintReplay", "target_allowed"]

log = logging.getLogger(__name__)


class ConstraintReplay:
    """Allowed-token masks of constrained train items. ``tokenizer``: an HF tokenizer or a path to load it from."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._grammars: dict[tuple[int, tuple[int, ...]], Grammars] = {}

    @property
    def tokenizer(self) -> Any:
        """The tokenizer (loaded from its path on first use)."""
        if isinstance(self._tokenizer, str):
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self._tokenizer)
        return self._tokenizer

    def _for(self, rec: dict[str, Any], step_id: str) -> Grammars:
        lib = str(rec.get("library", ""))
        if lib.split(" ")[0] != LIBRARY.split(" ")[0]:
            raise ValidationError(f"constraint sampled with {lib!r}, cannot replay with {LIBRARY!r}", step_id=step_id)
        if lib != LIBRARY:
            log.warning("step %s: constraint sampled with %s, replayed with %s", step_id, lib, LIBRARY)
        try:
            key = (int(rec["vocab_size"]), tuple(int(t) for t in rec["stop_token_ids"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ValidationError(f"constraint record lacks vocab_size / stop_token_ids: {e}", step_id=step_id) from e
        g = self._grammars.get(key)
        if g is None:
            g = self._grammars[key] = Grammars(self.tokenizer, key[0], list(key[1]))
        return g

    def masks(self, item: TrainSeq) -> torch.Tensor | None:
        """Bool ``(len(response_ids), vocab)`` for a constrained item, None for a free one."""
        rec = item.constraint
        if rec is None:
            return None
        try:
            return self._for(rec, item.step_id).masks(Constraint.from_record(rec), item.response_ids)
        except ValidationError as e:
            raise ValidationError(e.message, step_id=item.step_id, **e.context) from e

    def item_masks(self, items: Sequence[TrainSeq]) -> dict[int, torch.Tensor]:
        """``item index -> masks`` for the constrained items of a batch."""
        out = {}
        for i, it in enumerate(items):
            m = self.masks(it)
            if m is not None:
                out[i] = m
        return out


def target_allowed(masks: dict[int, torch.Tensor], col: Collated) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(target indices, allowed rows)`` of the constrained targets of ``col`` (None when there are none)."""
    if not masks:
        return None
    sel, rows = [], []
    for t, (i, k) in enumerate(zip(col.target_item.tolist(), col.target_offset.tolist(), strict=True)):
        m = masks.get(i)
        if m is not None:
            sel.append(t)
            rows.append(m[k])
    if not sel:
        return None
    return torch.tensor(sel, dtype=torch.long), torch.stack(rows)
