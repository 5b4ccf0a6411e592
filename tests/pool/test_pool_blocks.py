"""Content-addressed token blocks: exact ids back, shared contexts stored once (20-turn episode)."""

from __future__ import annotations

import random

from pool_helpers import episode

from swarm.pool import Pool
from swarm.pool.blocks import cut, pack_floats, unpack_floats, unpack_ids
from swarm.records import Step


def test_cut_chains_prefix_hashes():
    a, tail_a = cut(list(range(10)), 4)
    b, tail_b = cut(list(range(8)) + [99, 98, 97], 4)
    assert [k for k, _ in a[:2]] == [k for k, _ in b[:2]]  # same prefix, same keys
    c, _ = cut([0, 1, 2, 3, 9, 9, 9, 9], 4)
    d, _ = cut([1, 1, 1, 1, 9, 9, 9, 9], 4)
    assert c[1][1] == d[1][1] and c[1][0] != d[1][0]  # same tokens, different prefix: different key
    assert unpack_ids(b"".join(t for _, t in a) + tail_a) == list(range(10))
    assert unpack_ids(tail_b) == [99, 98, 97]
    lps = [-0.1, -2 / 3, -1e-310]
    assert unpack_floats(pack_floats(lps)) == lps


def _twenty_turns(pool: Pool, seed: int) -> list[Step]:
    rng = random.Random(seed)
    ep = episode(pool)
    ctx = [rng.randrange(32_000) for _ in range(300)]  # system prompt + task
    out = []
    for i in range(20):
        resp = [rng.randrange(32_000) for _ in range(rng.randrange(20, 60))]
        s = Step(
            episode_id=ep.episode_id,
            index=i,
            prompt_ids=list(ctx),
            response_ids=resp,
            response_logprobs=[-rng.random() for _ in resp],
        )
        out.append(s)
        ctx = ctx + resp + [rng.randrange(32_000) for _ in range(rng.randrange(5, 40))]
    pool.add_steps(out)
    return out


def test_twenty_turn_episode_stores_shared_context_once(pool_url: str):
    pool = Pool(pool_url, block_size=16)
    try:
        steps = _twenty_turns(pool, seed=0)
        for s in steps:
            got = pool.get_step(s.step_id)
            assert (got.prompt_ids, got.response_ids, got.response_logprobs) == (
                s.prompt_ids,
                s.response_ids,
                s.response_logprobs,
            )
        tok = pool.stats()["tokens"]
        logical = sum(s.length for s in steps)
        longest = max(s.length for s in steps)
        assert tok["logical"] == logical
        # storage grows with new tokens: the longest sequence plus < one block of tail per step
        assert longest <= tok["stored"] < longest + 20 * 16
        assert tok["dedupe_ratio"] > 5
        # a second, unrelated episode adds its own tokens only
        steps2 = _twenty_turns(pool, seed=1)
        assert pool.stats()["tokens"]["stored"] < tok["stored"] + max(s.length for s in steps2) + 20 * 16
    finally:
        pool.close()


def test_block_sizes_can_change_between_opens(pool_url: str):
    p1 = Pool(pool_url, block_size=8)
    ep = episode(p1)
    s1 = Step(episode_id=ep.episode_id, prompt_ids=list(range(50)), response_ids=[1, 2])
    p1.add_step(s1)
    p1.close()
    p2 = Pool(pool_url, block_size=1_000_000)  # effectively inline storage
    s2 = Step(episode_id=ep.episode_id, index=1, prompt_ids=list(range(60)), response_ids=[3])
    p2.add_step(s2)
    assert p2.get_step(s1.step_id).prompt_ids == list(range(50))
    assert p2.get_step(s2.step_id).prompt_ids == list(range(60))
    p2.close()
