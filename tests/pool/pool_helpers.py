"""Small builders for pool tests: episodes, seeded steps, finished prompt groups."""

from __future__ import annotations

import random

from swarm.pool import Pool
from swarm.records import Episode, Step


def episode(pool: Pool, task: str = "math", **kw) -> Episode:
    return pool.add_episode(Episode(task=task, **kw))


def step(
    ep: Episode | str, index: int = 0, n_prompt: int = 5, n_response: int = 3, seed: int | None = None, **kw
) -> Step:
    """A step with random (seeded) prompt ids, response ids and exact-float logprobs."""
    rng = random.Random(seed)
    kw.setdefault("prompt_ids", [rng.randrange(50_000) for _ in range(n_prompt)])
    kw.setdefault("response_ids", [rng.randrange(50_000) for _ in range(n_response)])
    kw.setdefault("response_logprobs", [-rng.random() * 5 for _ in kw["response_ids"]])
    ep_id = ep if isinstance(ep, str) else ep.episode_id
    return Step(episode_id=ep_id, index=index, **kw)


def group(pool: Pool, gid: str, rewards: list[float], task: str = "math", **step_kw) -> list[Step]:
    """A finished prompt group: one single-step episode per reward."""
    out = []
    for r in rewards:
        ep = episode(pool, task=task, group_id=gid)
        s = step(ep, **step_kw)
        pool.add_step(s)
        pool.end_episode(ep.episode_id, reward=r)
        out.append(s)
    return out


def seeded_step(episode_id: str, batch: int, i: int, block_size: int = 64) -> Step:
    """Step ``i`` of batch ``batch``: deterministic, so another process can check it exactly."""
    rng = random.Random(batch * 100_000 + i)
    shared = [batch] * (2 * block_size)  # a context shared by the whole batch
    resp = [rng.randrange(2**32) for _ in range(rng.randrange(1, 30))]
    return Step(
        step_id=f"step-{batch}-{i}",
        episode_id=episode_id,
        index=batch * 1000 + i,
        group_id=f"g-{batch}-{i // 4}",
        prompt_ids=shared + [rng.randrange(2**32) for _ in range(rng.randrange(0, 300))],
        response_ids=resp,
        response_logprobs=[-rng.random() for _ in resp],
        created_at=1000.0 + batch * 1000 + i,
    )
