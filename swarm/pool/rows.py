"""Stored rows as records (episodes, steps, with their tokens), the reads every part of the pool
shares, and the step digest.

Rows read back are trusted (they were validated on the way in), so steps are rebuilt with
``model_construct``: reading many long token lists does not re-run the validators. The reads run in
the caller's transaction (a connection); they never open one.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from swarm.errors import ConflictError, NotFoundError, SwarmError
from swarm.pool.blocks import (
    CHAIN,
    HASH_BYTES,
    pack_floats,
    pack_ids,
    split_hashes,
    unpack_floats,
    unpack_message,
    unpack_tokens,
)
from swarm.pool.checks import chunks
from swarm.pool.query import JOIN
from swarm.pool.schema import blocks as B
from swarm.pool.schema import episodes as E
from swarm.pool.schema import messages as M
from swarm.pool.schema import steps as S
from swarm.records import Episode, EpisodeStatus, RewardStatus, Source, Step

__all__ = ["digest", "to_episode", "to_step", "read_episode", "open_episode", "read_steps", "load_tokens",
           "load_messages", "ORDERS", "EPISODE_COLS"]

_TOKEN_COLS = ("block_keys", "tail", "logprobs")
EPISODE_COLS = ("episode_id", "task", "group_id", "client_id", "type", "status", "reward", "reward_status",
                "timeout_s", "created_at", "updated_at", "ended_at")
ORDERS = {  # the step orders of query_steps
    "created": (S.c.created_at, S.c.step_id),
    "-created": (S.c.created_at.desc(), S.c.step_id.desc()),
    "episode": (S.c.episode_id, S.c.idx, S.c.created_at),
}


_BULKY = {"prompt_ids", "response_ids", "response_logprobs", "reward", "reward_status"}


def digest(s: Step) -> bytes:
    """The hash that makes re-adding a step idempotent: the whole record, rewards aside.

    Token ids and logprobs are hashed packed (JSON-encoding long float lists is slow).
    """
    data = s.model_dump(mode="json", exclude=_BULKY)
    h = hashlib.blake2b(json.dumps(data, sort_keys=True).encode(), digest_size=16)
    h.update(len(s.prompt_ids).to_bytes(8, "little"))
    h.update(pack_ids(s.prompt_ids + s.response_ids))
    h.update(b"-" if s.response_logprobs is None else b"+" + pack_floats(s.response_logprobs))
    return h.digest()


def to_episode(r: Mapping[str, Any]) -> Episode:
    """A stored ``episodes`` row as an Episode."""
    return Episode(**{k: r[k] for k in EPISODE_COLS}, metadata=r["meta"])


def to_step(r: Mapping[str, Any], ids: list[int] | None, messages: list[dict[str, Any]] | None = None) -> Step:
    """A stored row as a Step (trusted data: constructed without re-validation); ``messages``: its prompt
    messages when the body names them by their chain's head (:func:`load_messages`)."""
    body = r["body"]
    own = r["reward"] is not None
    if ids is None:
        prompt, response, logprobs = [], [], None
    else:
        n = r["n_prompt"]
        prompt, response = ids[:n], ids[n:]
        logprobs = None if r["logprobs"] is None else unpack_floats(r["logprobs"])
    return Step.model_construct(step_id=r["step_id"], episode_id=r["episode_id"], index=r["idx"],
                                parent_step_id=r["parent_step_id"], task=r["task"], group_id=r["group_id"],
                                policy=r["policy"], policy_version=r["policy_version"], source=Source(r["source"]),
                                prompt_messages=body.get("prompt_messages", messages), prompt_ids=prompt,
                                response_text=body.get("response_text"), tool_calls=body.get("tool_calls") or [],
                                response_ids=response, response_logprobs=logprobs,
                                finish_reason=body.get("finish_reason"), response_id=r["response_id"],
                                prefix_consistent=body.get("prefix_consistent"),
                                reward=r["reward"] if own else r["ep_reward"],
                                reward_status=RewardStatus(r["reward_status"] if own else r["ep_reward_status"]),
                                created_at=r["created_at"], timings=body.get("timings") or {}, metadata=r["meta"])


def read_episode(c: sa.Connection, episode_id: str) -> Episode:
    """The stored episode; NotFoundError if there is none."""
    row = c.execute(sa.select(E).where(E.c.episode_id == episode_id)).mappings().first()
    if row is None:
        raise NotFoundError("no such episode", episode_id=episode_id)
    return to_episode(row)


def open_episode(c: sa.Connection, episode_id: str) -> Episode:
    """The stored episode; NotFoundError if there is none, ConflictError if it has ended."""
    ep = read_episode(c, episode_id)
    if ep.status != EpisodeStatus.open:
        raise ConflictError(f"episode is {ep.status.value}, not open", episode_id=episode_id)
    return ep


def read_steps(c: sa.Connection, where: list[sa.ColumnElement], with_tokens: bool, order: tuple = ORDERS["created"],
               limit: int | None = None, offset: int = 0) -> list[Step]:
    """Steps matching ``where`` (over ``steps JOIN episodes``) in ``order``, with their tokens if asked."""
    cols = [col for col in S.c if with_tokens or col.name not in _TOKEN_COLS]
    q = (sa.select(*cols, E.c.reward.label("ep_reward"), E.c.reward_status.label("ep_reward_status"))
         .select_from(JOIN).where(*where).order_by(*order).offset(offset))
    if limit is not None:
        q = q.limit(limit)
    rows = list(c.execute(q).mappings())
    tokens = load_tokens(c, rows) if with_tokens else {}
    messages = load_messages(c, rows)
    return [to_step(r, tokens.get(r["step_id"]), messages.get(r["step_id"])) for r in rows]


def _chain_walk(table: sa.Table, payload: str) -> sa.Select:
    """Every row of the chains in ``table`` that end at the keys bound as ``heads``: each row once, however
    many chains share it (``UNION`` drops the rows already found).

    Each step back is a correlated lookup by primary key, not a join: a join lets PostgreSQL's planner hash
    the whole table (it did, for a few thousand blocks), which would read every block of a mid-sized pool
    to walk a few. A missing row comes back with a NULL payload (the reader reports it)."""
    start = sa.select(table.c.key, table.c.prev, table.c[payload])
    chain = start.where(table.c.key.in_(sa.bindparam("heads", expanding=True))).cte("chain", recursive=True)
    back = table.alias("back")

    def of(col: str) -> sa.ScalarSelect:
        return sa.select(back.c[col]).where(back.c.key == chain.c.prev).scalar_subquery()

    chain = chain.union(sa.select(chain.c.prev, of("prev"), of(payload)).where(chain.c.prev.is_not(None)))
    return sa.select(chain.c.key, chain.c.prev, chain.c[payload])


_WALK = _chain_walk(B, "tokens")
_WALK_MESSAGES = _chain_walk(M, "message")


def _walk(c: sa.Connection, q: sa.Select, heads: set[bytes]) -> dict[bytes, tuple[bytes | None, bytes]]:
    found: dict[bytes, tuple[bytes | None, bytes]] = {}
    for chunk in chunks(sorted(heads)):
        found.update((k, (p, v)) for k, p, v in c.execute(q, {"heads": chunk}) if v is not None)
    return found


def _back(found: dict[bytes, tuple[bytes | None, bytes]], head: bytes) -> list[bytes]:
    """The keys of the chain ending at ``head``, first to last (KeyError where a link is missing)."""
    keys, key = [], head
    while key:
        keys.append(key)
        key = found[key][0]
    keys.reverse()
    return keys


def load_messages(c: sa.Connection, rows: list[Mapping[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The prompt messages of each row whose body names them by their chain's head, by step_id (rows whose
    body holds them inline are not in the answer)."""
    heads = {r["step_id"]: bytes.fromhex(h) for r in rows if (h := (r["body"] or {}).get("prompt_messages_head"))}
    if not heads:
        return {}
    found = _walk(c, _WALK_MESSAGES, set(heads.values()))
    out = {}
    for sid, head in heads.items():
        try:
            # decoded per step: two steps never share (and so never mutate) one message dict
            out[sid] = [unpack_message(found[k][1]) for k in _back(found, head)]
        except KeyError as e:
            raise SwarmError("step references a missing chat message", step_id=sid) from e
    return out


_LISTED = sa.select(B.c.key, B.c.prev, B.c.tokens).where(B.c.key.in_(sa.bindparam("keys", expanding=True)))


def _is_head(block_keys: bytes) -> bool:
    return len(block_keys) == HASH_BYTES + 1 and block_keys[-1:] == CHAIN


def load_tokens(c: sa.Connection, rows: list[Mapping[str, Any]], missing_ok: bool = False) -> dict[str, list[int]]:
    """Each row's token ids (prompt then response) by step_id; a missing block raises (or is empty: ``missing_ok``).

    A row's ``block_keys`` is its chain's head (walked back through ``prev``) or, written by an older
    version, every key in order; ``tail`` follows the blocks."""
    heads, listed = set(), set()
    for r in rows:
        bk = r["block_keys"] or b""
        if _is_head(bk):
            heads.add(bk[:HASH_BYTES])
        else:
            listed.update(split_hashes(bk))
    found = _walk(c, _WALK, heads)
    for chunk in chunks(sorted(listed - found.keys())):
        found.update((k, (p, t)) for k, p, t in c.execute(_LISTED, {"keys": chunk}))
    decoded: dict[bytes, list[int]] = {}  # each block decoded once, however many rows share it

    def ids_of(key: bytes) -> list[int]:
        got = decoded.get(key)
        if got is None:
            got = decoded[key] = unpack_tokens(found[key][1])
        return got

    out = {}
    for r in rows:
        bk = r["block_keys"] or b""
        try:
            if _is_head(bk):
                keys = _back(found, bk[:HASH_BYTES])
            else:
                keys = split_hashes(bk)
            parts = [ids_of(k) if k in found or not missing_ok else [] for k in keys]
        except KeyError as e:
            if not missing_ok:
                raise SwarmError("step references a missing token block", step_id=r["step_id"]) from e
            parts = []
        out[r["step_id"]] = list(itertools.chain.from_iterable(parts)) + unpack_tokens(r["tail"])
    return out
