"""The data pool: durable, indexed storage of episodes and steps, and everything about them.

:class:`Pool` writes what the gateway and white-box agents record (episodes, steps, rewards,
events, labels, policy versions) and reads it back for curation. Every call is one
transaction: it either happens completely or raises a :mod:`swarm.errors` exception and
leaves nothing behind. A Pool is thread-safe and any number of processes may open the same
database. Leases live in :mod:`swarm.pool.lease`, exports in :mod:`swarm.pool.export`.

Errors raised here:
    ValidationError  a record or argument is malformed (the message names the field)
    NotFoundError    the episode / step named does not exist
    ConflictError    the call contradicts stored state: a step id re-used for a different
                     step, a write to an ended episode, ending an episode twice
    LeaseError       (leases) unknown, expired, released or acknowledged lease

It does not tokenize, compute advantages or talk HTTP.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

import pydantic
import sqlalchemy as sa

from swarm.errors import ConflictError, NotFoundError, SwarmError, ValidationError
from swarm.pool.blocks import cut, pack_floats, split_hashes, unpack_floats, unpack_ids
from swarm.pool.engine import insert_ignore, make_engine, transaction
from swarm.pool.export import ExportMixin
from swarm.pool.filter import StepFilter
from swarm.pool.lease import LeaseMixin
from swarm.pool.query import JOIN, REWARD, REWARD_FINAL, episode_conditions, step_conditions
from swarm.pool.schema import blocks as B
from swarm.pool.schema import episodes as E
from swarm.pool.schema import events as EV
from swarm.pool.schema import labels as L
from swarm.pool.schema import leases as LS
from swarm.pool.schema import policy_versions as PV
from swarm.pool.schema import steps as S
from swarm.records import Episode, EpisodeStatus, Event, Label, PolicyVersion, RewardStatus, Source, Step, now

__all__ = ["Pool"]

R = TypeVar("R", bound=pydantic.BaseModel)
_TOKEN_COLS = ("block_keys", "tail", "logprobs")
_ORDERS = {
    "created": (S.c.created_at, S.c.step_id),
    "-created": (S.c.created_at.desc(), S.c.step_id.desc()),
    "episode": (S.c.episode_id, S.c.idx, S.c.created_at),
}
_IN_CHUNK = 500  # bound parameters per IN (...) list


def coerce(model: type[R], obj: Any, what: str) -> R:
    """``obj`` as a validated ``model``; a pydantic error becomes a ValidationError naming fields."""
    if isinstance(obj, model):
        return obj
    try:
        return model.model_validate(obj)
    except pydantic.ValidationError as e:
        parts = [f"{'.'.join(str(x) for x in err['loc']) or what}: {err['msg']}" for err in e.errors()]
        raise ValidationError(f"invalid {what}: " + "; ".join(parts)) from e


def _chunks(items: list, n: int = _IN_CHUNK) -> Iterable[list]:
    for i in range(0, len(items), n):
        yield items[i : i + n]


class Pool(LeaseMixin, ExportMixin):
    """The data pool on SQLite (``sqlite:///file.db``) or PostgreSQL (``postgresql+psycopg://``).

    ``block_size`` is the token block length of the content-addressed store; steps written
    with different block sizes coexist (each step lists its own blocks).
    """

    def __init__(self, url: str = "sqlite:///swarm_pool.db", block_size: int = 64) -> None:
        if block_size < 1:
            raise ValidationError("block_size must be >= 1", block_size=block_size)
        self.url = url
        self.block_size = block_size
        self.engine = make_engine(url)
        self.dialect = self.engine.dialect.name

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _tx(self, write: bool = False):
        return transaction(self.engine, write=write)

    # ---------------------------------------------------------------- episodes
    def add_episode(self, ep: Episode) -> Episode:
        ep = coerce(Episode, ep, "episode")
        row = {
            "episode_id": ep.episode_id,
            "task": ep.task,
            "group_id": ep.group_id,
            "client_id": ep.client_id,
            "type": ep.type.value,
            "status": ep.status.value,
            "reward": ep.reward,
            "reward_status": ep.reward_status.value,
            "timeout_s": ep.timeout_s,
            "created_at": ep.created_at,
            "updated_at": ep.updated_at,
            "ended_at": ep.ended_at,
            "meta": ep.metadata,
        }
        with self._tx(write=True) as c:
            if c.execute(sa.select(E.c.episode_id).where(E.c.episode_id == ep.episode_id)).first():
                raise ConflictError("an episode with this id already exists", episode_id=ep.episode_id)
            c.execute(E.insert(), row)
        return ep

    def get_episode(self, episode_id: str) -> Episode:
        with self._tx() as c:
            return self._episode(c, episode_id)

    def _episode(self, c: sa.Connection, episode_id: str) -> Episode:
        row = c.execute(sa.select(E).where(E.c.episode_id == episode_id)).mappings().first()
        if row is None:
            raise NotFoundError("no such episode", episode_id=episode_id)
        return _to_episode(row)

    def _open_episode(self, c: sa.Connection, episode_id: str) -> Episode:
        ep = self._episode(c, episode_id)
        if ep.status != EpisodeStatus.open:
            raise ConflictError(f"episode is {ep.status.value}, not open", episode_id=episode_id)
        return ep

    def heartbeat(self, episode_id: str) -> None:
        """Record activity on an open episode (keeps abandon_stale away)."""
        with self._tx(write=True) as c:
            self._open_episode(c, episode_id)
            c.execute(E.update().where(E.c.episode_id == episode_id).values(updated_at=now()))

    def end_episode(
        self,
        episode_id: str,
        status: EpisodeStatus = EpisodeStatus.finished,
        reward: float | None = None,
        step_rewards: Mapping[str, float] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Episode:
        """End an open episode; ``reward`` / ``step_rewards`` given here are final."""
        status = coerce_enum(EpisodeStatus, status, "status")
        if status == EpisodeStatus.open:
            raise ValidationError("status: an episode cannot be ended as open", episode_id=episode_id)
        _check_reward(reward, "reward")
        for sid, r in (step_rewards or {}).items():
            _check_reward(r, f"step_rewards[{sid}]")
        with self._tx(write=True) as c:
            ep = self._open_episode(c, episode_id)
            t = now()
            values: dict[str, Any] = {"status": status.value, "updated_at": t, "ended_at": t}
            if reward is not None:
                values |= {"reward": float(reward), "reward_status": RewardStatus.final.value}
            if metadata:
                values["meta"] = {**ep.metadata, **dict(metadata)}
            c.execute(E.update().where(E.c.episode_id == episode_id).values(**values))
            for sid, r in (step_rewards or {}).items():
                res = c.execute(
                    S.update()
                    .where(S.c.step_id == sid, S.c.episode_id == episode_id)
                    .values(reward=float(r), reward_status=RewardStatus.final.value)
                )
                if res.rowcount != 1:
                    raise NotFoundError(
                        "step_rewards names a step not in this episode", episode_id=episode_id, step_id=sid
                    )
            return self._episode(c, episode_id)

    def abort_episode(self, episode_id: str) -> Episode:
        """End an open episode as failed."""
        return self.end_episode(episode_id, status=EpisodeStatus.failed)

    def abandon_stale(self, now: float | None = None) -> list[str]:
        """Mark open episodes idle for longer than their ``timeout_s`` abandoned; returns their ids.

        Their steps stay in the pool (for analysis) but are never leased for training.
        """
        t = _now() if now is None else now
        stale = sa.and_(
            E.c.status == EpisodeStatus.open.value,
            E.c.timeout_s.is_not(None),
            E.c.updated_at + E.c.timeout_s < t,
        )
        with self._tx(write=True) as c:
            ids = list(c.execute(sa.select(E.c.episode_id).where(stale)).scalars())
            for chunk in _chunks(ids):
                c.execute(
                    E.update()
                    .where(E.c.episode_id.in_(chunk), E.c.status == EpisodeStatus.open.value)
                    .values(status=EpisodeStatus.abandoned.value, ended_at=t, updated_at=t)
                )
        return ids

    def query_episodes(self, filter: StepFilter | None = None, limit: int = 100, offset: int = 0) -> list[Episode]:
        f = coerce(StepFilter, filter or StepFilter(), "filter")
        _check_page(limit, offset)
        q = (
            sa.select(E)
            .where(*episode_conditions(f, self.dialect))
            .order_by(E.c.created_at, E.c.episode_id)
            .limit(limit)
            .offset(offset)
        )
        with self._tx() as c:
            return [_to_episode(r) for r in c.execute(q).mappings()]

    # ---------------------------------------------------------------- steps
    def add_step(self, step: Step) -> str:
        return self.add_steps([step])[0]

    def add_steps(self, steps: list[Step]) -> list[str]:
        """Store a batch of steps in one transaction; idempotent on step_id.

        Re-adding a step identical to the stored one (rewards aside) is a no-op; a different
        step under an existing id is a ConflictError. New steps need their episode to exist
        (NotFoundError) and be open (ConflictError). Empty ``task`` / ``group_id`` are taken
        from the episode.
        """
        batch: dict[str, Step] = {}
        for i, s in enumerate(steps):
            s = coerce(Step, s, f"steps[{i}]")
            if s.step_id in batch and _digest(batch[s.step_id]) != _digest(s):
                raise ConflictError("two different steps in one batch share a step_id", step_id=s.step_id)
            batch[s.step_id] = s
        if not batch:
            return []
        prepared = {sid: self._prepare(s) for sid, s in batch.items()}
        for attempt in range(3):
            try:
                with self._tx(write=True) as c:
                    self._insert_steps(c, batch, prepared)
                break
            except sa.exc.IntegrityError:
                # a concurrent writer (PostgreSQL) inserted one of these ids first: look again
                if attempt == 2:
                    raise
        return [s.step_id for s in steps]

    def _prepare(self, s: Step) -> dict[str, Any]:
        try:
            full, tail = cut(s.prompt_ids + s.response_ids, self.block_size)
        except OverflowError as e:
            raise ValidationError("prompt_ids/response_ids: token ids must be < 2**32", step_id=s.step_id) from e
        return {
            "blocks": full,
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
                "block_keys": b"".join(k for k, _ in full),
                "tail": tail,
                "logprobs": None if s.response_logprobs is None else pack_floats(s.response_logprobs),
                "body": {
                    "prompt_messages": s.prompt_messages,
                    "response_text": s.response_text,
                    "tool_calls": s.tool_calls,
                    "finish_reason": s.finish_reason,
                    "prefix_consistent": s.prefix_consistent,
                    "timings": s.timings,
                },
                "meta": s.metadata,
            },
        }

    def _insert_steps(self, c: sa.Connection, batch: dict[str, Step], prepared: dict[str, dict]) -> None:
        existing: dict[str, bytes] = {}
        for chunk in _chunks(list(batch)):
            existing.update(
                (k, v) for k, v in c.execute(sa.select(S.c.step_id, S.c.digest).where(S.c.step_id.in_(chunk)))
            )
        ep_ids = sorted({s.episode_id for s in batch.values()})
        eps: dict[str, Any] = {}
        for chunk in _chunks(ep_ids):
            q = sa.select(E.c.episode_id, E.c.status, E.c.task, E.c.group_id).where(E.c.episode_id.in_(chunk))
            eps.update({r.episode_id: r for r in c.execute(q)})
        rows, block_rows, touched = [], {}, set()
        for sid, s in batch.items():
            ep = eps.get(s.episode_id)
            if ep is None:
                raise NotFoundError("step names an episode that does not exist", episode_id=s.episode_id, step_id=sid)
            norm = s.model_copy(update={"task": s.task or ep.task, "group_id": s.group_id or ep.group_id})
            digest = _digest(norm)
            if sid in existing:
                if existing[sid] != digest:
                    raise ConflictError("a different step with this step_id is already stored", step_id=sid)
                continue
            if ep.status != EpisodeStatus.open.value:
                raise ConflictError(f"episode is {ep.status}, not open", episode_id=s.episode_id, step_id=sid)
            p = prepared[sid]
            rows.append({**p["row"], "task": norm.task, "group_id": norm.group_id, "digest": digest})
            block_rows.update(p["blocks"])
            touched.add(s.episode_id)
        insert_ignore(c, B, [{"key": k, "tokens": t} for k, t in block_rows.items()])
        if rows:
            c.execute(S.insert(), rows)
        if touched:
            c.execute(E.update().where(E.c.episode_id.in_(sorted(touched))).values(updated_at=now()))

    def get_step(self, step_id: str, with_tokens: bool = True) -> Step:
        with self._tx() as c:
            got = self._read_steps(c, [S.c.step_id == step_id], with_tokens=with_tokens)
        if not got:
            raise NotFoundError("no such step", step_id=step_id)
        return got[0]

    def get_step_by_response_id(self, response_id: str, with_tokens: bool = True) -> Step:
        with self._tx() as c:
            got = self._read_steps(
                c, [S.c.response_id == response_id], with_tokens=with_tokens, order=_ORDERS["created"], limit=1
            )
        if not got:
            raise NotFoundError("no step with this response_id", response_id=response_id)
        return got[0]

    def last_step(self, episode_id: str, with_tokens: bool = True) -> Step | None:
        """The episode's step with the highest index (latest written on ties), or None."""
        order = (S.c.idx.desc(), S.c.created_at.desc(), S.c.step_id.desc())
        with self._tx() as c:
            got = self._read_steps(c, [S.c.episode_id == episode_id], with_tokens=with_tokens, order=order, limit=1)
            if not got:
                self._episode(c, episode_id)  # NotFoundError for an unknown episode
        return got[0] if got else None

    def query_steps(
        self,
        filter: StepFilter | None = None,
        limit: int = 100,
        offset: int = 0,
        with_tokens: bool = False,
        order: str = "created",
    ) -> list[Step]:
        """Steps matching ``filter``; ``order`` is "created", "-created" or "episode" (id, index).

        Without tokens, ``prompt_ids`` / ``response_ids`` come back empty and logprobs None.
        """
        f = coerce(StepFilter, filter or StepFilter(), "filter")
        _check_page(limit, offset)
        if order not in _ORDERS:
            raise ValidationError(f"order: must be one of {sorted(_ORDERS)}, got {order!r}")
        with self._tx() as c:
            return self._read_steps(
                c, step_conditions(f, self.dialect), with_tokens, order=_ORDERS[order], limit=limit, offset=offset
            )

    def count_steps(self, filter: StepFilter | None = None) -> int:
        f = coerce(StepFilter, filter or StepFilter(), "filter")
        q = sa.select(sa.func.count()).select_from(JOIN).where(*step_conditions(f, self.dialect))
        with self._tx() as c:
            return int(c.execute(q).scalar_one())

    def _read_steps(
        self,
        c: sa.Connection,
        where: list[sa.ColumnElement],
        with_tokens: bool,
        order: tuple = _ORDERS["created"],
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Step]:
        cols = [col for col in S.c if with_tokens or col.name not in _TOKEN_COLS]
        q = (
            sa.select(*cols, E.c.reward.label("ep_reward"), E.c.reward_status.label("ep_reward_status"))
            .select_from(JOIN)
            .where(*where)
            .order_by(*order)
            .offset(offset)
        )
        if limit is not None:
            q = q.limit(limit)
        rows = list(c.execute(q).mappings())
        tokens = self._load_tokens(c, rows) if with_tokens else {}
        return [_to_step(r, tokens.get(r["step_id"])) for r in rows]

    def _load_tokens(self, c: sa.Connection, rows: list[Mapping[str, Any]]) -> dict[str, list[int]]:
        keys = sorted({k for r in rows for k in split_hashes(r["block_keys"])})
        found: dict[bytes, bytes] = {}
        for chunk in _chunks(keys):
            found.update((k, v) for k, v in c.execute(sa.select(B.c.key, B.c.tokens).where(B.c.key.in_(chunk))))
        out = {}
        for r in rows:
            try:
                data = b"".join(found[k] for k in split_hashes(r["block_keys"]))
            except KeyError as e:
                raise SwarmError("step references a missing token block", step_id=r["step_id"]) from e
            out[r["step_id"]] = unpack_ids(data + r["tail"])
        return out

    # ---------------------------------------------------------------- rewards, events, labels
    def set_reward(
        self, *, episode_id: str | None = None, step_id: str | None = None, reward: float, final: bool = True
    ) -> None:
        """Set an episode's or a step's reward, at any time (late rewards are welcome)."""
        if (episode_id is None) == (step_id is None):
            raise ValidationError("set_reward needs exactly one of episode_id and step_id")
        _check_reward(reward, "reward")
        status = (RewardStatus.final if final else RewardStatus.pending).value
        with self._tx(write=True) as c:
            if step_id is not None:
                res = c.execute(
                    S.update().where(S.c.step_id == step_id).values(reward=float(reward), reward_status=status)
                )
                if res.rowcount != 1:
                    raise NotFoundError("no such step", step_id=step_id)
            else:
                res = c.execute(
                    E.update()
                    .where(E.c.episode_id == episode_id)
                    .values(reward=float(reward), reward_status=status, updated_at=now())
                )
                if res.rowcount != 1:
                    raise NotFoundError("no such episode", episode_id=episode_id)

    def add_event(self, ev: Event) -> str:
        """Store an event or feedback; a ``reward`` event also sets the (final) reward."""
        ev = coerce(Event, ev, "event")
        with self._tx(write=True) as c:
            if ev.step_id is not None:
                owner = c.execute(sa.select(S.c.episode_id).where(S.c.step_id == ev.step_id)).scalar()
                if owner is None:
                    raise NotFoundError("event names a step that does not exist", step_id=ev.step_id)
                if ev.episode_id is not None and ev.episode_id != owner:
                    raise ValidationError("episode_id: the step belongs to another episode", step_id=ev.step_id)
                ev = ev.model_copy(update={"episode_id": owner})
            else:
                self._episode(c, ev.episode_id)
            if c.execute(sa.select(EV.c.event_id).where(EV.c.event_id == ev.event_id)).first():
                raise ConflictError("an event with this id already exists", event_id=ev.event_id)
            c.execute(
                EV.insert(),
                {
                    "event_id": ev.event_id,
                    "kind": ev.kind,
                    "episode_id": ev.episode_id,
                    "step_id": ev.step_id,
                    "created_at": ev.created_at,
                    "record": ev.model_dump(mode="json"),
                },
            )
        if ev.kind == "reward":
            target = {"step_id": ev.step_id} if ev.step_id is not None else {"episode_id": ev.episode_id}
            self.set_reward(**target, reward=ev.value, final=True)
        return ev.event_id

    def events(self, episode_id: str | None = None, step_id: str | None = None) -> list[Event]:
        """Events of an episode (all of them, step events included) or of one step."""
        if episode_id is None and step_id is None:
            raise ValidationError("events needs an episode_id or a step_id")
        q = sa.select(EV.c.record).order_by(EV.c.created_at, EV.c.event_id)
        q = q.where(EV.c.step_id == step_id) if step_id is not None else q.where(EV.c.episode_id == episode_id)
        with self._tx() as c:
            return [Event.model_validate(r) for r in c.execute(q).scalars()]

    def label(self, target: str, target_id: str, label: str, exclude: bool = False, note: str = "") -> Label:
        """Mark a step or an episode; ``exclude=True`` drops it from filters (and training)."""
        lbl = coerce(
            Label, {"target": target, "target_id": target_id, "label": label, "exclude": exclude, "note": note}, "label"
        )
        table, col = (S, S.c.step_id) if lbl.target == "step" else (E, E.c.episode_id)
        with self._tx(write=True) as c:
            if c.execute(sa.select(col).where(col == target_id)).first() is None:
                raise NotFoundError(f"no such {lbl.target}", **{f"{lbl.target}_id": target_id})
            c.execute(L.insert(), lbl.model_dump())
        return lbl

    def labels(self, target_id: str) -> list[Label]:
        q = sa.select(L).where(L.c.target_id == target_id).order_by(L.c.created_at, L.c.label_id)
        with self._tx() as c:
            return [Label.model_validate(dict(r)) for r in c.execute(q).mappings()]

    # ---------------------------------------------------------------- policy versions
    def add_policy_version(self, pv: PolicyVersion) -> PolicyVersion:
        """Record a published version; re-adding the same one is a no-op, a different one a ConflictError."""
        pv = coerce(PolicyVersion, pv, "policy version")
        with self._tx(write=True) as c:
            old = c.execute(
                sa.select(PV.c.adapter_path).where(PV.c.policy == pv.policy, PV.c.version == pv.version)
            ).first()
            if old is not None:
                if old.adapter_path != pv.adapter_path:
                    raise ConflictError("this policy version already exists", policy=pv.policy, version=pv.version)
                return pv
            c.execute(
                PV.insert(),
                {
                    "policy": pv.policy,
                    "version": pv.version,
                    "adapter_path": pv.adapter_path,
                    "created_at": pv.created_at,
                    "meta": pv.metadata,
                },
            )
        return pv

    def latest_version(self, policy: str) -> int:
        """The highest published version of ``policy``; 0 when none was published."""
        with self._tx() as c:
            v = c.execute(sa.select(sa.func.max(PV.c.version)).where(PV.c.policy == policy)).scalar()
        return int(v or 0)

    def policy_versions(self, policy: str) -> list[PolicyVersion]:
        q = sa.select(PV).where(PV.c.policy == policy).order_by(PV.c.version)
        with self._tx() as c:
            return [
                PolicyVersion(
                    policy=r["policy"],
                    version=r["version"],
                    adapter_path=r["adapter_path"],
                    created_at=r["created_at"],
                    metadata=r["meta"],
                )
                for r in c.execute(q).mappings()
            ]

    # ---------------------------------------------------------------- stats
    def stats(self) -> dict[str, Any]:
        """Counts of steps and episodes by status, source, task and policy; token storage."""
        t = _now()

        def by(c: sa.Connection, col: sa.ColumnElement, frm: Any) -> dict[str, int]:
            q = sa.select(col, sa.func.count()).select_from(frm).group_by(col)
            return {str(k): int(n) for k, n in c.execute(q)}

        with self._tx() as c:
            n_steps = c.execute(sa.select(sa.func.count()).select_from(S)).scalar_one()
            logical = c.execute(sa.select(sa.func.coalesce(sa.func.sum(S.c.length), 0))).scalar_one()
            tail_bytes = c.execute(sa.select(sa.func.coalesce(sa.func.sum(sa.func.length(S.c.tail)), 0))).scalar_one()
            n_blocks, block_bytes = c.execute(
                sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(sa.func.length(B.c.tokens)), 0))
            ).one()
            status = sa.case((REWARD_FINAL, "final"), else_="pending")
            consumed = c.execute(
                sa.select(sa.func.count()).select_from(S).where(S.c.consumed_version.is_not(None))
            ).scalar_one()
            leased = c.execute(
                sa.select(sa.func.count())
                .select_from(S)
                .where(S.c.consumed_version.is_(None), S.c.lease_id.is_not(None), S.c.lease_expires_at > t)
            ).scalar_one()
            mean_reward = c.execute(sa.select(sa.func.avg(REWARD)).select_from(JOIN).where(REWARD_FINAL)).scalar()
            stored = (int(block_bytes) + int(tail_bytes)) // 4
            return {
                "steps": {
                    "total": int(n_steps),
                    "by_source": by(c, S.c.source, S),
                    "by_task": by(c, S.c.task, S),
                    "by_policy": by(c, S.c.policy, S),
                    "by_policy_version": by(c, S.c.policy + ":" + sa.cast(S.c.policy_version, sa.String), S),
                    "by_reward_status": by(c, status, JOIN),
                    "by_episode_status": by(c, E.c.status, JOIN),
                    "consumed": int(consumed),
                    "leased": int(leased),
                    "mean_final_reward": None if mean_reward is None else float(mean_reward),
                },
                "episodes": {
                    "total": int(c.execute(sa.select(sa.func.count()).select_from(E)).scalar_one()),
                    "by_status": by(c, E.c.status, E),
                    "by_task": by(c, E.c.task, E),
                    "by_type": by(c, E.c.type, E),
                },
                "tokens": {
                    "logical": int(logical),
                    "stored": stored,
                    "blocks": int(n_blocks),
                    "dedupe_ratio": (int(logical) / stored) if stored else None,
                },
                "leases": {
                    "active": int(
                        c.execute(
                            sa.select(sa.func.count())
                            .select_from(LS)
                            .where(LS.c.state == "active", LS.c.expires_at > t)
                        ).scalar_one()
                    )
                },
            }


# -------------------------------------------------------------------- helpers
_now = now


def coerce_enum(enum: type, value: Any, field: str) -> Any:
    try:
        return enum(value)
    except ValueError as e:
        raise ValidationError(f"{field}: must be one of {[m.value for m in enum]}, got {value!r}") from e


def _check_reward(value: float | None, field: str) -> None:
    if value is None:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or value != value
        or value in (float("inf"), float("-inf"))
    ):
        raise ValidationError(f"{field}: must be a finite number, got {value!r}")


def _check_page(limit: int, offset: int) -> None:
    if limit < 0 or offset < 0:
        raise ValidationError(f"limit and offset must be >= 0, got limit={limit}, offset={offset}")


def _digest(s: Step) -> bytes:
    data = s.model_dump(mode="json", exclude={"reward", "reward_status"})
    return hashlib.blake2b(json.dumps(data, sort_keys=True).encode(), digest_size=16).digest()


def _to_episode(r: Mapping[str, Any]) -> Episode:
    return Episode(
        episode_id=r["episode_id"],
        task=r["task"],
        group_id=r["group_id"],
        client_id=r["client_id"],
        type=r["type"],
        status=r["status"],
        reward=r["reward"],
        reward_status=r["reward_status"],
        timeout_s=r["timeout_s"],
        created_at=r["created_at"],
        updated_at=r["updated_at"],
        ended_at=r["ended_at"],
        metadata=r["meta"],
    )


def _to_step(r: Mapping[str, Any], ids: list[int] | None) -> Step:
    """A stored row as a Step (trusted data: constructed without re-validation)."""
    body = r["body"]
    own = r["reward"] is not None
    if ids is None:
        prompt, response, logprobs = [], [], None
    else:
        n = r["n_prompt"]
        prompt, response = ids[:n], ids[n:]
        logprobs = None if r["logprobs"] is None else unpack_floats(r["logprobs"])
    return Step.model_construct(
        step_id=r["step_id"],
        episode_id=r["episode_id"],
        index=r["idx"],
        parent_step_id=r["parent_step_id"],
        task=r["task"],
        group_id=r["group_id"],
        policy=r["policy"],
        policy_version=r["policy_version"],
        source=Source(r["source"]),
        prompt_messages=body.get("prompt_messages"),
        prompt_ids=prompt,
        response_text=body.get("response_text"),
        tool_calls=body.get("tool_calls") or [],
        response_ids=response,
        response_logprobs=logprobs,
        finish_reason=body.get("finish_reason"),
        response_id=r["response_id"],
        prefix_consistent=body.get("prefix_consistent"),
        reward=r["reward"] if own else r["ep_reward"],
        reward_status=RewardStatus(r["reward_status"] if own else r["ep_reward_status"]),
        created_at=r["created_at"],
        timings=body.get("timings") or {},
        metadata=r["meta"],
    )
