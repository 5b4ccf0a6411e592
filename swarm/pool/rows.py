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
from swarm.pool.blocks import CHAIN, HASH_BYTES, pack_floats, pack_ids, split_hashes, unpack_floats, unpack_tokens
from swarm.pool.checks import chunks
from swarm.pool.query import JOIN
from swarm.pool.schema import blocks as B
from swarm.pool.schema import episodes as E
from swarm.pool.schema import steps as S
from swarm.records import Episode, EpisodeStatus, RewardStatus, Source, Step

__all__ = ["digest", "to_episode", "to_step", "read_episode", "open_episode", "read_steps", "load_tokens", "ORDERS",
           "EPISODE_COLS"]

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


def to_step(r: Mapping[str, Any], ids: list[int] | None) -> Step:
    """A stored row as a Step (trusted data: constructed without re-validation)."""
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
                                prompt_messages=body.get("prompt_messages"), prompt_ids=prompt,
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
    return [to_step(r, tokens.get(r["step_id"])) for r in rows]


def _chain_walk() -> sa.Select:
    """Every block of the chains that end at the keys bound as ``heads``: each block once, however many
    chains share it (``UNION`` drops the rows already found), one primary-key lookup a block."""
    start = sa.select(B.c.key, B.c.prev, B.c.tokens).where(B.c.key.in_(sa.bindparam("heads", expanding=True)))
    chain = start.cte("chain", recursive=True)
    back = B.alias("back")
    chain = chain.union(sa.select(back.c.key, back.c.prev, back.c.tokens).where(back.c.key == chain.c.prev))
    return sa.select(chain.c.key, chain.c.prev, chain.c.tokens)


_WALK = _chain_walk()
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
    found: dict[bytes, tuple[bytes | None, bytes]] = {}
    for chunk in chunks(sorted(heads)):
        found.update((k, (p, t)) for k, p, t in c.execute(_WALK, {"heads": chunk}))
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
                keys, key = [], bk[:HASH_BYTES]
                while key:
                    keys.append(key)
                    key = found[key][0]
                keys.reverse()
            else:
                keys = split_hashes(bk)
            parts = [ids_of(k) if k in found or not missing_ok else [] for k in keys]
        except KeyError as e:
            if not missing_ok:
                raise SwarmError("step references a missing token block", step_id=r["step_id"]) from e
            parts = []
        out[r["step_id"]] = list(itertools.chain.from_iterable(parts)) + unpack_tokens(r["tail"])
    return out
