"""The data pool: durable, indexed storage of episodes and steps, and everything about them.

:class:`Pool` writes what the gateway and white-box agents record (episodes, steps, rewards,
events, labels, policy versions) and reads it back for curation. Every call is one
transaction: it either happens completely or raises a :mod:`swarm.errors` exception and
leaves nothing behind. A Pool is thread-safe and any number of processes may open the same
database. Opening and ending episodes live in :mod:`swarm.pool.episodes`; rewards, events,
labels, versions and stats in :mod:`swarm.pool.annotate`, leases in :mod:`swarm.pool.lease`,
exports in :mod:`swarm.pool.export`, client agreements (C4 / C5) in :mod:`swarm.pool.agreements`,
the monitoring queries in :mod:`swarm.pool.overview`; what one database does differently in its engine
module (:mod:`swarm.pool.engines`). :func:`open_pool` opens a pool on a configured or a plugin's engine.

Errors raised here:
    ValidationError  a record or argument is malformed (the message names the field)
    NotFoundError    the episode / step named does not exist
    ConflictError    the call contradicts stored state: a step id re-used for a different
                     step, a write to an ended episode, ending an episode twice
    LeaseError       (leases) unknown, expired, released or acknowledged lease

It does not tokenize, compute advantages or talk HTTP.
"""

from __future__ import annotations

import threading
from typing import Any

import sqlalchemy as sa

from swarm.errors import ConflictError, NotFoundError, ValidationError
from swarm.pool.agreements import AgreementsMixin
from swarm.pool.annotate import AnnotateMixin
from swarm.pool.blocks import head_of, pack_logprobs
from swarm.pool.checks import check_page, chunks, coerce, scrub_nul
from swarm.pool.claims import ClaimsMixin
from swarm.pool.curations import CurationsMixin
from swarm.pool.engine import DriverConnection
from swarm.pool.engines import Dialect, engine_section
from swarm.pool.episodes import Ended, EpisodeEnding, EpisodesMixin
from swarm.pool.evals import EvalsMixin
from swarm.pool.export import ExportMixin
from swarm.pool.feedback import FeedbackMixin
from swarm.pool.filter import StepFilter
from swarm.pool.heads import LAST_INDEX, HeadsMixin
from swarm.pool.lease import LeaseMixin
from swarm.pool.lineage import LineageMixin
from swarm.pool.overview import Overview
from swarm.pool.prefixes import PrefixMemo
from swarm.pool.query import JOIN, episode_conditions, step_conditions
from swarm.pool.rewards import RewardsMixin
from swarm.pool.rows import ORDERS, digest, read_episode, read_steps, to_episode
from swarm.pool.schema import blocks as B
from swarm.pool.schema import episodes as E
from swarm.pool.schema import messages as M
from swarm.pool.schema import missing_columns, upgrade
from swarm.pool.schema import steps as S
from swarm.pool.settle import SettleMixin
from swarm.records import Episode, EpisodeStatus, Step, now

__all__ = ["Pool", "open_pool"]

# the statements of every step write, built once (SQLAlchemy then reuses their compiled form;
# building them per call cost more CPU than running them)
_IDS = sa.bindparam("ids", expanding=True)
_EXISTING = sa.select(S.c.step_id, S.c.digest, S.c.idx).where(S.c.step_id.in_(_IDS))
_EPISODES = sa.select(E.c.episode_id, E.c.status, E.c.task, E.c.group_id).where(E.c.episode_id.in_(_IDS))
_TOPS = sa.select(E.c.episode_id, LAST_INDEX).where(E.c.episode_id.in_(_IDS))  # one seek an episode (heads.py)
_TOUCH = E.update().where(E.c.episode_id.in_(_IDS)).values(updated_at=sa.bindparam("t"))
_INSERT = S.insert()


class Pool(EpisodesMixin, AnnotateMixin, LeaseMixin, SettleMixin, ExportMixin, HeadsMixin, AgreementsMixin,
           RewardsMixin, EvalsMixin, CurationsMixin, FeedbackMixin, LineageMixin, ClaimsMixin):
    """The data pool on one of the engines of :mod:`swarm.pool.engines`: SQLite (``sqlite:///file.db``) or
    PostgreSQL (``postgresql+psycopg://``) built in.

    ``block_size`` is the token block length of the content-addressed store; steps written
    with different block sizes coexist (each step lists its own blocks). ``sql`` is the engine's
    :class:`~swarm.pool.engines.Dialect` (default: the URL scheme's, default settings);
    :func:`swarm.pool.open_pool` opens a pool with configured settings or an engine of a plugin.
    ``overview`` holds the monitoring queries (:class:`~swarm.pool.overview.Overview`).
    """

    def __init__(self, url: str = "sqlite:///swarm_pool.db", block_size: int = 64, sql: Dialect | None = None) -> None:
        if block_size < 1:
            raise ValidationError("block_size must be >= 1", block_size=block_size)
        super().__init__(url, sql)
        with self._tx() as c:  # columns an older pool lacks (Database creates the missing tables)
            stale = bool(missing_columns(c))
        if stale:
            with self._tx(write=True) as c:
                upgrade(c, self.sql.add_column)
        self.block_size = block_size
        self._overview = Overview(self)
        # keys of blocks and messages this process has seen committed: a step's write skips the rows of the
        # context it shares with earlier steps (nothing ever deletes a block or a message)
        self._known: dict[bytes, None] = {}
        self._known_lock = threading.Lock()
        self._prefixes = PrefixMemo()

    @property
    def overview(self) -> Overview:
        """The bounded, read-only monitoring queries of this pool (the dashboard's)."""
        return self._overview

    @property
    def single_writer(self) -> bool:
        """Whether a write excludes every other (SQLite): a caller may then queue its own writers."""
        return self.sql.single_writer

    # ---------------------------------------------------------------- episodes
    def get_episode(self, episode_id: str) -> Episode:
        """The stored episode; NotFoundError if there is none."""
        with self._tx() as c:
            return read_episode(c, episode_id)

    def query_episodes(self, filter: StepFilter | None = None, limit: int = 100, offset: int = 0) -> list[Episode]:
        """Episodes matching ``filter`` (its episode conditions), oldest first."""
        f = coerce(StepFilter, filter or StepFilter(), "filter")
        check_page(limit, offset)
        q = (sa.select(E).where(*episode_conditions(f, self.sql)).order_by(E.c.created_at, E.c.episode_id)
             .limit(limit).offset(offset))
        with self._tx() as c:
            return [to_episode(r) for r in c.execute(q).mappings()]

    # ---------------------------------------------------------------- steps
    def add_step(self, step: Step) -> str:
        """Store one step (see :meth:`add_steps`); returns its id."""
        return self.add_steps([step])[0]

    def add_steps(self, steps: list[Step], append: bool = False, wait: bool = True) -> list[str]:
        """Store a batch of steps in one transaction; idempotent on step_id.

        Re-adding a step identical to the stored one (rewards aside) is a no-op; a different
        step under an existing id is a ConflictError. New steps need their episode to exist
        (NotFoundError) and be open (ConflictError). Empty ``task`` / ``group_id`` are taken
        from the episode. With ``append``, new steps get their episode's next indices inside
        the write transaction (in batch order, also set on the given Step objects), so several
        gateways writing one episode never hand out the same index. ``wait=False`` (only where
        :attr:`nowait_writes`): :class:`~swarm.pool.engine.WriteBusy`, nothing written, instead of
        waiting for another writer's lock; an event loop may make such a write itself.
        """
        batch: dict[str, Step] = {}
        for i, s in enumerate(steps):
            s = coerce(Step, s, f"steps[{i}]")
            if s.step_id in batch and digest(batch[s.step_id]) != digest(s):
                raise ConflictError("two different steps in one batch share a step_id", step_id=s.step_id)
            batch[s.step_id] = s
        if not batch:
            return []
        prepared = {sid: self._prepare(s) for sid, s in batch.items()}
        for attempt in range(3):
            try:  # SQLite: on the driver, the same statements without SQLAlchemy's per-call work (docs/pool.md)
                with self._driver_write(wait) if self.sql.driver_sql or not wait else self._tx(write=True) as c:
                    n_new, written = self._insert_steps(c, batch, prepared, append)
                self._remember(written)  # committed
                break
            except sa.exc.IntegrityError:
                # a concurrent writer (PostgreSQL) inserted one of these ids first: look again
                if attempt == 2:
                    raise
        self._maybe_analyze(n_new)
        return [s.step_id for s in steps]

    def end_episodes(self, endings: list[EpisodeEnding]) -> list[Ended]:
        """See :meth:`swarm.pool.episodes.EpisodesMixin.end_episodes`; what was kept of the ended contexts is dropped."""
        ended = super().end_episodes(endings)
        for e in ended:
            self._prefixes.forget(e.episode.episode_id)
        return ended

    def _prepare(self, s: Step) -> dict[str, Any]:
        body = scrub_nul(_body(s))  # model text may hold NUL; the ids below keep it exactly
        msgs, chained = body.pop("prompt_messages", None), {}
        try:  # what the episode's previous step already cut is taken, not cut again (swarm/pool/prefixes.py)
            (full, tail, _), chain = self._prefixes.cut(s.episode_id, s.prompt_ids + s.response_ids, self.block_size,
                                                        msgs)
        except OverflowError as e:
            raise ValidationError("prompt_ids/response_ids: token ids must be < 2**32", step_id=s.step_id) from e
        keys = [k for k, _ in full]
        if msgs:  # stored once per conversation, chained: the step names the last one
            body["prompt_messages_head"] = chain[-1][0].hex()
            mkeys = [k for k, _ in chain]
            chained = {k: {"key": k, "prev": p, "message": m} for (k, m), p in zip(chain, [None, *mkeys], strict=False)}
        elif msgs is not None:
            body["prompt_messages"] = msgs
        return {
            "blocks": {k: {"key": k, "prev": p, "tokens": t} for (k, t), p in zip(full, [None, *keys], strict=False)},
            "messages": chained,
            "row": {
                "step_id": s.step_id,
                "episode_id": s.episode_id,
                "idx": s.index,
                "parent_step_id": s.parent_step_id,
                "policy": s.policy,
                "policy_version": s.policy_version,
                "source": s.source.value,
                "response_id": s.response_id,
                "reward": s.reward,
                "reward_status": s.reward_status.value,
                "created_at": s.created_at,
                "length": s.length,
                "n_prompt": len(s.prompt_ids),
                "block_keys": head_of(full),  # the last block's key: reading walks the chain back
                "tail": tail,
                "logprobs": None if s.response_logprobs is None else pack_logprobs(s.response_logprobs),
                "body": body,
                "meta": scrub_nul(s.metadata),
            },
        }

    def _insert_steps(self, c: sa.Connection | DriverConnection, batch: dict[str, Step], prepared: dict[str, dict],
                      append: bool = False) -> tuple[int, list[bytes]]:
        existing: dict[str, tuple[bytes, int]] = {}
        for chunk in chunks(list(batch)):
            existing.update((r.step_id, (r.digest, r.idx)) for r in c.execute(_EXISTING, {"ids": chunk}))
        ep_ids = sorted({s.episode_id for s in batch.values()})
        eps: dict[str, Any] = {}
        # appends to one episode queue here on PostgreSQL (FOR UPDATE); SQLite's write lock does it there
        q = self.sql.lock_rows(_EPISODES) if append else _EPISODES
        for chunk in chunks(ep_ids):
            eps.update({r.episode_id: r for r in c.execute(q, {"ids": chunk})})
        next_idx: dict[str, int] = {}
        if append:  # every appended-to episode's next index, in one query for the whole batch
            for chunk in chunks(ep_ids):
                next_idx.update((e, top + 1) for e, top in c.execute(_TOPS, {"ids": chunk}) if top is not None)
        rows, block_rows, message_rows, touched = [], {}, {}, set()
        for sid, s in batch.items():
            ep = eps.get(s.episode_id)
            if ep is None:
                raise NotFoundError("step names an episode that does not exist", episode_id=s.episode_id, step_id=sid)
            norm = s.model_copy(update={"task": s.task or ep.task, "group_id": s.group_id or ep.group_id})
            if sid in existing:
                stored_digest, stored_idx = existing[sid]
                if append:  # the retry was numbered before it knew the stored index
                    norm = norm.model_copy(update={"index": stored_idx})
                if stored_digest != digest(norm):
                    raise ConflictError("a different step with this step_id is already stored", step_id=sid)
                continue
            if ep.status != EpisodeStatus.open.value:
                raise ConflictError(f"episode is {ep.status}, not open", episode_id=s.episode_id, step_id=sid)
            if append:
                s.index = next_idx.get(s.episode_id, 0)
                next_idx[s.episode_id] = s.index + 1
                norm = norm.model_copy(update={"index": s.index})
            dig = digest(norm)
            p = prepared[sid]
            rows.append({**p["row"], "idx": norm.index, "task": norm.task, "group_id": norm.group_id, "digest": dig})
            block_rows.update(p["blocks"])
            message_rows.update(p["messages"])
            touched.add(s.episode_id)
        with self._known_lock:
            block_rows = [r for k, r in block_rows.items() if k not in self._known]
            message_rows = [r for k, r in message_rows.items() if k not in self._known]
        self.sql.insert_ignore(c, B, block_rows)
        self.sql.insert_ignore(c, M, message_rows)
        if rows:
            c.execute(_INSERT, rows)
        if touched:
            c.execute(_TOUCH, {"ids": sorted(touched), "t": now()})
        return len(rows), [r["key"] for r in block_rows] + [r["key"] for r in message_rows]

    def _remember(self, keys: list[bytes], capacity: int = 1 << 16) -> None:
        """Note committed block and message keys (the oldest forgotten beyond ``capacity``)."""
        with self._known_lock:
            for k in keys:
                self._known[k] = None
            while len(self._known) > capacity:
                del self._known[next(iter(self._known))]

    def get_step(self, step_id: str, with_tokens: bool = True) -> Step:
        """The stored step; NotFoundError if there is none."""
        with self._tx() as c:
            got = read_steps(c, [S.c.step_id == step_id], with_tokens=with_tokens)
        if not got:
            raise NotFoundError("no such step", step_id=step_id)
        return got[0]

    def get_step_by_response_id(self, response_id: str, with_tokens: bool = True) -> Step:
        """The (first written) step that answered with ``response_id``; NotFoundError if none did."""
        with self._tx() as c:
            got = read_steps(c, [S.c.response_id == response_id], with_tokens=with_tokens, limit=1)
        if not got:
            raise NotFoundError("no step with this response_id", response_id=response_id)
        return got[0]

    def last_step(self, episode_id: str, with_tokens: bool = True) -> Step | None:
        """The episode's step with the highest index (latest written on ties), or None."""
        order = (S.c.idx.desc(), S.c.created_at.desc(), S.c.step_id.desc())
        with self._tx() as c:
            got = read_steps(c, [S.c.episode_id == episode_id], with_tokens=with_tokens, order=order, limit=1)
            if not got:
                read_episode(c, episode_id)  # NotFoundError for an unknown episode
        return got[0] if got else None

    def query_steps(self, filter: StepFilter | None = None, limit: int = 100, offset: int = 0,
                    with_tokens: bool = False, order: str = "created") -> list[Step]:
        """Steps matching ``filter``; ``order`` is "created", "-created" or "episode" (id, index).

        Without tokens, ``prompt_ids`` / ``response_ids`` come back empty and logprobs None.
        """
        f = coerce(StepFilter, filter or StepFilter(), "filter")
        check_page(limit, offset)
        if order not in ORDERS:
            raise ValidationError(f"order: must be one of {sorted(ORDERS)}, got {order!r}")
        with self._tx() as c:
            return read_steps(c, step_conditions(f, self.sql), with_tokens, ORDERS[order], limit, offset)

    def count_episodes(self, filter: StepFilter | None = None) -> int:
        """How many episodes match ``filter`` (its episode conditions)."""
        f = coerce(StepFilter, filter or StepFilter(), "filter")
        q = sa.select(sa.func.count()).select_from(E).where(*episode_conditions(f, self.sql))
        with self._tx() as c:
            return int(c.execute(q).scalar_one())

    def count_steps(self, filter: StepFilter | None = None) -> int:
        """How many steps match ``filter``."""
        f = coerce(StepFilter, filter or StepFilter(), "filter")
        q = sa.select(sa.func.count()).select_from(JOIN).where(*step_conditions(f, self.sql))
        with self._tx() as c:
            return int(c.execute(q).scalar_one())


def _body(s: Step) -> dict[str, Any]:
    """The step's JSON body without its None values, no tool calls and no timings: they read back the same
    (:func:`swarm.pool.rows.to_step`), and every step saves their keys' bytes."""
    body = {"prompt_messages": s.prompt_messages, "response_text": s.response_text, "tool_calls": s.tool_calls or None,
            "finish_reason": s.finish_reason, "prefix_consistent": s.prefix_consistent, "timings": s.timings or None}
    return {k: v for k, v in body.items() if v is not None}


def open_pool(url: str, *, engine: str | None = None, **settings: Any) -> Pool:
    """Open the pool at ``url`` (tables created when missing) on the engine its scheme names, or on ``engine``:
    a built-in kind or the dotted path of a module that declares one (:mod:`swarm.pool.engines`).

    ``settings`` are ``block_size`` and the engine's own (SQLite's ``busy_timeout_s``, ...); a mistyped one is
    a ConfigError naming the close one. ``open_pool(**section.model_dump())`` opens a validated ``pool`` section.
    """
    section = engine_section(url, engine, **settings)
    return Pool(section.url, block_size=section.block_size, sql=section.build())
