"""Human feedback read back for training: ratings of steps and episodes, corrections and their uses.

``POST /v1/feedback`` stores ratings and corrections as ``Event(kind="feedback")`` rows; the gateway
adds a correction's exact token ids (``payload["correction_tokens"]``: the corrected step, its policy,
the ids) when it serves the step's policy; a correction of an episode corrects its last step. This mixin reads them in batches for one update (never one query per
step) and records which update trained which correction (table ``feedback_uses``):

- :meth:`FeedbackMixin.feedback_ratings`: the ratings on given steps and on their episodes.
- :meth:`FeedbackMixin.unrewarded_ratings`: ratings on a policy's finished, unconsumed train steps
  (or their episodes) that have no final reward: what the ``fill`` rule turns into rewards.
- :meth:`FeedbackMixin.pending_corrections`: a policy's corrections trained fewer than ``max_uses``
  times, oldest first, with the corrected step's exact prompt ids.
- :meth:`FeedbackMixin.record_feedback_uses` / :meth:`FeedbackMixin.feedback_uses`: the uses.
- :func:`has_feedback`: whether there is any (a trainer reads nothing more of an update while there is none).

A mixin of :class:`swarm.pool.store.Pool`; same transactions and errors. It does not map ratings to
rewards or build training items (``swarm.train.feedback`` does) and does not tokenize.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from swarm.errors import ValidationError
from swarm.pool.checks import chunks
from swarm.pool.engine import Database
from swarm.pool.filter import StepFilter
from swarm.pool.query import JOIN, step_conditions
from swarm.pool.rows import read_steps
from swarm.pool.schema import NAME_LEN
from swarm.pool.schema import events as EV
from swarm.pool.schema import feedback_uses as FU
from swarm.pool.schema import steps as S
from swarm.records import EpisodeStatus, EpisodeType, RewardStatus, Source, now

__all__ = ["FeedbackMixin", "Rating", "Correction", "CORRECTION_KEY", "has_feedback"]

CORRECTION_KEY = "correction_tokens"  # the gateway's key in a feedback event's payload (clients may not send it)
_FEEDBACK = EV.c.kind == "feedback"


@dataclass(frozen=True)
class Rating:
    """One rating: on a step (``step_id``) or on a whole episode (``step_id`` None); ``source`` is the
    reward source its caller had (``agent``: the episode's key, ``judge``: a client / admin token)."""

    event_id: str
    episode_id: str
    step_id: str | None
    rating: float
    source: str
    created_at: float


@dataclass(frozen=True)
class Correction:
    """One correction with exact ids: the corrected step's prompt and the correction as its response."""

    event_id: str
    episode_id: str
    step_id: str
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    uses: int  # updates that trained it so far


def _rating(rec: dict[str, Any], episode_id: str | None = None) -> Rating | None:
    r = rec.get("rating")
    if r is None:
        return None
    source = "agent" if rec.get("source") == Source.blackbox.value else "judge"
    return Rating(event_id=rec["event_id"], episode_id=rec.get("episode_id") or episode_id or "",
                  step_id=rec.get("step_id"), rating=float(r), source=source, created_at=float(rec["created_at"]))


class FeedbackMixin(Database):
    """Feedback reads and uses for :class:`swarm.pool.store.Pool` (see the module docstring)."""

    def feedback_ratings(self, step_ids: list[str]) -> list[Rating]:
        """Ratings on these steps and on their episodes, oldest first."""
        ids = list(dict.fromkeys(step_ids))
        if not ids:
            return []
        with self._tx() as c:
            eps: set[str] = set()
            for chunk in chunks(ids):
                eps.update(c.execute(sa.select(S.c.episode_id).where(S.c.step_id.in_(chunk))).scalars())
            recs: dict[str, dict[str, Any]] = {}
            for chunk in chunks(ids):
                q = sa.select(EV.c.record).where(_FEEDBACK, EV.c.step_id.in_(chunk))
                recs.update((r["event_id"], r) for r in c.execute(q).scalars())
            for chunk in chunks(sorted(eps)):
                q = sa.select(EV.c.record).where(_FEEDBACK, EV.c.step_id.is_(None), EV.c.episode_id.in_(chunk))
                recs.update((r["event_id"], r) for r in c.execute(q).scalars())
        out = [r for rec in recs.values() if (r := _rating(rec)) is not None]
        return sorted(out, key=lambda r: (r.created_at, r.event_id))

    def unrewarded_ratings(self, policy: str, limit: int = 10_000) -> list[Rating]:
        """Ratings on ``policy``'s finished, unconsumed train steps without a final reward (or on their
        episodes), oldest first, at most ``limit``."""
        with self._tx() as c:
            recs = [r for r in c.execute(sa.select(EV.c.record).where(_FEEDBACK)
                                         .order_by(EV.c.created_at, EV.c.event_id)).scalars()
                    if r.get("rating") is not None]
            if not recs:
                return []
            flt = StepFilter(policy=policy, episode_status=EpisodeStatus.finished, episode_type=EpisodeType.train,
                             reward_status=RewardStatus.pending, consumed=False)
            cond = step_conditions(flt, self.sql)
            step_ids = sorted({r["step_id"] for r in recs if r.get("step_id")})
            ep_ids = sorted({r["episode_id"] for r in recs if not r.get("step_id") and r.get("episode_id")})
            ok_steps: set[str] = set()
            ok_eps: set[str] = set()
            for chunk in chunks(step_ids):
                ok_steps.update(c.execute(sa.select(S.c.step_id).select_from(JOIN)
                                          .where(*cond, S.c.step_id.in_(chunk))).scalars())
            for chunk in chunks(ep_ids):
                ok_eps.update(c.execute(sa.select(S.c.episode_id).select_from(JOIN)
                                        .where(*cond, S.c.episode_id.in_(chunk))).scalars())
        out = [r for rec in recs if (r := _rating(rec)) is not None
               and (r.step_id in ok_steps if r.step_id else r.episode_id in ok_eps)]
        return out[:limit]

    def pending_corrections(self, policy: str, max_uses: int = 1, limit: int = 16) -> list[Correction]:
        """``policy``'s corrections (with exact ids) trained fewer than ``max_uses`` times, oldest first."""
        if max_uses < 1 or limit < 0:
            raise ValidationError(f"max_uses must be >= 1 and limit >= 0, got {max_uses} / {limit}")
        if limit == 0:
            return []
        uses = sa.select(FU.c.event_id, sa.func.count().label("n")).where(FU.c.policy == policy).group_by(FU.c.event_id)
        uses = uses.subquery()
        q = (sa.select(EV.c.record, sa.func.coalesce(uses.c.n, 0).label("n"))
             .select_from(EV.outerjoin(uses, uses.c.event_id == EV.c.event_id))
             .where(_FEEDBACK, sa.func.coalesce(uses.c.n, 0) < max_uses)
             .order_by(EV.c.created_at, EV.c.event_id))
        with self._tx() as c:
            found: list[tuple[dict[str, Any], int]] = []
            for rec, n in c.execute(q):
                tokens = (rec.get("payload") or {}).get(CORRECTION_KEY)
                if (isinstance(tokens, dict) and tokens.get("policy") == policy and tokens.get("ids")
                        and tokens.get("step_id")):
                    found.append((rec, int(n)))
                    if len(found) == limit:
                        break
            steps = {}
            for chunk in chunks(sorted({rec["payload"][CORRECTION_KEY]["step_id"] for rec, _ in found})):
                steps.update((s.step_id, s) for s in read_steps(c, [S.c.step_id.in_(chunk)], with_tokens=True))
        out = []
        for rec, n in found:
            step = steps.get(rec["payload"][CORRECTION_KEY]["step_id"])
            if step is None or not step.prompt_ids:
                continue
            out.append(Correction(event_id=rec["event_id"], episode_id=step.episode_id, step_id=step.step_id,
                                  prompt_ids=tuple(step.prompt_ids),
                                  response_ids=tuple(int(t) for t in rec["payload"][CORRECTION_KEY]["ids"]), uses=n))
        return out

    def record_feedback_uses(self, event_ids: list[str], consumed_version: int, policy: str) -> int:
        """Record that the update publishing ``consumed_version`` of ``policy`` trained these feedback
        events (idempotent per event and version); returns how many were given."""
        if not policy or len(policy) > NAME_LEN:
            raise ValidationError(f"policy must be 1..{NAME_LEN} characters", policy=policy)
        t = now()
        rows = [{"event_id": e, "consumed_version": int(consumed_version), "policy": policy, "created_at": t}
                for e in dict.fromkeys(event_ids)]
        with self._tx(write=True) as c:
            self.sql.insert_ignore(c, FU, rows)
        return len(rows)

    def feedback_uses(self, event_ids: list[str]) -> dict[str, list[int]]:
        """Per feedback event, the versions whose updates trained it (ascending; absent: never)."""
        out: dict[str, list[int]] = defaultdict(list)
        with self._tx() as c:
            for chunk in chunks(list(dict.fromkeys(event_ids))):
                q = (sa.select(FU.c.event_id, FU.c.consumed_version).where(FU.c.event_id.in_(chunk))
                     .order_by(FU.c.consumed_version))
                for e, v in c.execute(q):
                    out[e].append(int(v))
        return dict(out)


def has_feedback(pool: Database) -> bool:
    """Whether any feedback (rating or correction) was ever posted to ``pool``: one index lookup, so a trainer
    skips every other feedback read of an update while there is none (:func:`swarm.update.run_update`)."""
    with pool._tx() as c:
        return c.execute(_ANY).first() is not None


_ANY = sa.select(EV.c.event_id).where(_FEEDBACK).limit(1)
