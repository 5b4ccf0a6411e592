"""Content-addressed token blocks: exact ids back, shared contexts stored once (20-turn episode), compact byte
formats, and an older pool's rows read back after the upgrade."""

from __future__ import annotations

import hashlib
import random
from array import array

import sqlalchemy as sa
from pool_helpers import episode

from swarm.pool import Pool
from swarm.pool.blocks import (
    cut,
    head_of,
    pack_floats,
    pack_ids,
    pack_logprobs,
    pack_tokens,
    unpack_floats,
    unpack_tokens,
)
from swarm.pool.schema import blocks as B
from swarm.pool.schema import messages as M
from swarm.pool.schema import steps as S
from swarm.records import Step


def test_cut_chains_prefix_hashes():
    a, tail_a, _ = cut(list(range(10)), 4)
    b, tail_b, _ = cut(list(range(8)) + [99, 98, 97], 4)
    assert [k for k, _ in a[:2]] == [k for k, _ in b[:2]]  # same prefix, same keys
    c, _, _ = cut([0, 1, 2, 3, 9, 9, 9, 9], 4)
    d, _, _ = cut([1, 1, 1, 1, 9, 9, 9, 9], 4)
    assert c[1][1] == d[1][1] and c[1][0] != d[1][0]  # same tokens, different prefix: different key
    assert [i for _, t in a for i in unpack_tokens(t)] + unpack_tokens(tail_a) == list(range(10))
    assert unpack_tokens(tail_b) == [99, 98, 97]
    assert head_of(a) == a[-1][0] + b"\x01" and head_of([]) == b""
    lps = [-0.1, -2 / 3, -1e-310]
    assert unpack_floats(pack_floats(lps)) == lps


def test_compact_formats_round_trip_exactly():
    small, big = [0, 1, 65535], [0, 65536, 2**32 - 1]
    assert len(pack_tokens(small)) == 2 * 3 + 1 and unpack_tokens(pack_tokens(small)) == small
    assert len(pack_tokens(big)) == 4 * 3 + 1 and unpack_tokens(pack_tokens(big)) == big
    assert unpack_tokens(pack_ids(big)) == big and pack_tokens([]) == b"" == pack_ids([])  # older: plain uint32
    f32 = array("f", [-0.1, -2.5, -1e-30, float("-inf"), 0.0]).tolist()
    assert len(pack_logprobs(f32)) == 4 * 5 + 1 and unpack_floats(pack_logprobs(f32)) == f32
    f64 = [-0.1, -2 / 3, -1e-310]  # not float32 values: kept as float64
    assert pack_logprobs(f64) == pack_floats(f64) and unpack_floats(pack_logprobs(f64)) == f64
    assert unpack_floats(pack_logprobs([])) == []


def test_a_step_stores_one_head_however_long_its_context(pool_url: str):
    pool = Pool(pool_url, block_size=16)
    try:
        steps = _twenty_turns(pool, seed=2)
        with pool.engine.connect() as c:
            keys = c.execute(sa.select(S.c.block_keys)).scalars().all()
        assert {len(k) for k in keys} == {17}  # not 16 bytes per block of context
        got = pool.query_steps(with_tokens=True, limit=100, order="episode")  # one chain walk for all twenty
        assert [(g.prompt_ids, g.response_ids) for g in got] == [(s.prompt_ids, s.response_ids) for s in steps]
    finally:
        pool.close()


def _older_cut(ids: list[int], block_size: int) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """How the previous version cut and packed: unchained keys, plain uint32."""
    data, step, prev, out = pack_ids(ids), 4 * block_size, b"", []
    n_full = len(ids) // block_size
    for i in range(n_full):
        prev = hashlib.blake2b(prev + data[i * step : (i + 1) * step], digest_size=16).digest()
        out.append((prev, data[i * step : (i + 1) * step]))
    return out, data[n_full * step :]


def test_an_older_pool_opens_upgrades_and_reads_back_exactly(pool_url: str):
    pool = Pool(pool_url, block_size=8)
    ep = episode(pool)
    old = Step(episode_id=ep.episode_id, prompt_ids=list(range(30)), response_ids=[70000, 5],
               response_logprobs=[-0.25, -1 / 3])
    pool.add_step(old)
    # rewrite it as the previous version stored it, in a blocks table without ``prev``
    full, tail = _older_cut(old.prompt_ids + old.response_ids, 8)
    with pool._tx(write=True) as c:
        c.execute(B.delete())
        c.exec_driver_sql("ALTER TABLE blocks DROP COLUMN prev")
        c.execute(sa.insert(sa.table("blocks", sa.column("key"), sa.column("tokens"))),
                  [{"key": k, "tokens": t} for k, t in full])
        c.execute(S.update().where(S.c.step_id == old.step_id).values(
            block_keys=b"".join(k for k, _ in full), tail=tail, logprobs=pack_floats(old.response_logprobs)))
    pool.close()
    pool = Pool(pool_url, block_size=8)  # adds blocks.prev
    try:
        got = pool.get_step(old.step_id)
        assert (got.prompt_ids, got.response_ids, got.response_logprobs) == (
            old.prompt_ids, old.response_ids, old.response_logprobs)
        new = Step(episode_id=ep.episode_id, index=1, prompt_ids=old.prompt_ids + old.response_ids + [9] * 20,
                   response_ids=[1, 2, 3], response_logprobs=array("f", [-0.5, -0.75, -2.0]).tolist())
        pool.add_step(new)
        pool.add_step(old)  # re-adding the older step is still a no-op (same digest)
        both = {s.step_id: s for s in pool.query_steps(with_tokens=True)}
        for s in (old, new):
            assert (both[s.step_id].prompt_ids, both[s.step_id].response_ids,
                    both[s.step_id].response_logprobs) == (s.prompt_ids, s.response_ids, s.response_logprobs)
        assert pool.stats()["tokens"]["logical"] == old.length + new.length
    finally:
        pool.close()
    Pool(pool_url).close()  # opening an upgraded pool again changes nothing


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


def test_chat_histories_are_stored_once_and_read_back_exactly(pool_url: str):
    pool = Pool(pool_url)
    try:
        ep = episode(pool)
        history = [{"role": "system", "content": "you are é 漢字 \U0001f600", "name": "sys"},
                   {"role": "user", "content": [{"type": "text", "text": "hi"}]}]
        steps = []
        for i in range(6):
            steps.append(Step(episode_id=ep.episode_id, index=i, prompt_messages=[dict(m) for m in history],
                              prompt_ids=[1, 2, 3], response_ids=[4], response_text=f"reply {i}"))
            history += [{"role": "assistant", "content": f"reply {i}", "tool_calls": []},
                        {"role": "tool", "content": f"result {i}", "tool_call_id": "c"}]
        steps.append(Step(episode_id=ep.episode_id, index=6, prompt_messages=[], prompt_ids=[1]))
        steps.append(Step(episode_id=ep.episode_id, index=7, prompt_messages=None, prompt_ids=[1]))
        pool.add_steps(steps[:3])
        pool.add_steps(steps)  # the first three again: a no-op
        for s in steps:
            assert pool.get_step(s.step_id).prompt_messages == s.prompt_messages
        got = {g.step_id: g for g in pool.query_steps(limit=100)}
        assert [got[s.step_id].prompt_messages for s in steps] == [s.prompt_messages for s in steps]
        got[steps[1].step_id].prompt_messages[0]["content"] = "changed"  # each step has its own dicts
        assert got[steps[2].step_id].prompt_messages[0]["content"] == history[0]["content"]
        with pool.engine.connect() as c:
            n_messages = c.execute(sa.select(sa.func.count()).select_from(M)).scalar_one()
            bodies = c.execute(sa.select(S.c.body)).scalars().all()
        assert n_messages == 2 + 2 * 5  # each message once, not 2 + 4 + ... + 12 times
        assert not any("prompt_messages" in b and b["prompt_messages"] for b in bodies)
    finally:
        pool.close()


def test_inline_chat_histories_of_older_rows_still_read(pool_url: str):
    pool = Pool(pool_url)
    try:
        ep = episode(pool)
        s = Step(episode_id=ep.episode_id, prompt_messages=[{"role": "user", "content": "old"}], prompt_ids=[1])
        pool.add_step(s)
        with pool._tx(write=True) as c:
            c.execute(S.update().values(body={"prompt_messages": s.prompt_messages, "response_text": None}))
        assert pool.get_step(s.step_id).prompt_messages == s.prompt_messages
    finally:
        pool.close()
