"""Conversions between stored rows and records (episodes, steps) and the step digest.

Rows read back are trusted (they were validated on the way in), so steps are rebuilt with
``model_construct``: reading many long token lists does not re-run the validators.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from swarm.pool.blocks import pack_floats, pack_ids, unpack_floats
from swarm.records import Episode, RewardStatus, Source, Step

__all__ = ["digest", "to_episode", "to_step"]


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
