"""The pool cuts a conversation's next step from what its previous step was cut into (swarm/pool/prefixes.py).

Whatever the memo reuses, the blocks, tail and message chain must be those of a cut from scratch, byte for byte:
the keys are content addresses other steps and other gateways share.
"""

from __future__ import annotations

import random
from pathlib import Path

from swarm.pool import Pool, StepFilter
from swarm.pool.blocks import chain_messages, cut
from swarm.pool.prefixes import PrefixMemo
from swarm.records import Episode, Source, Step, new_id


def _scratch(ids: list[int], block_size: int, messages: list | None) -> tuple:
    blocks, tail, _ = cut(ids, block_size)
    return blocks, tail, chain_messages(messages) if messages else []


def test_every_reuse_gives_the_cut_from_scratch() -> None:
    rng = random.Random(0)
    memo = PrefixMemo()
    msgs: list[dict] = [{"role": "system", "content": "s" * 50}]
    ids = [rng.randrange(70_000) for _ in range(40)]
    cases = []
    for turn in range(12):  # a growing conversation
        msgs = [*msgs, {"role": "user", "content": f"turn {turn}"}]
        ids = ids + [rng.randrange(70_000) for _ in range(rng.randrange(5, 40))]
        cases.append((list(ids), [dict(m) for m in msgs]))
    edited = [dict(m) for m in msgs]
    edited[3]["content"] = "an edited middle message"
    cases.append((ids[:30] + [7] + ids[31:], edited))  # a token and a message changed mid-way
    cases.append((ids[:100], edited[:4]))  # a branch back to a shorter context
    typed = [*edited[:4], {"role": "tool", "content": "x", "n": 1}]
    cases += [(ids, typed), (ids, [*typed[:4], {**typed[4], "n": 1.0}]), (ids, [*typed[:4], {**typed[4], "n": True}])]
    cases += [(ids, None), (ids + [1], msgs)]  # a step without messages keeps the chain for the next one
    reused = 0
    for ids_k, msgs_k in cases:
        for block_size in (16, 16, 7):  # twice the same size, then another: nothing is reused across sizes
            before = memo._last.get("ep")
            (blocks, tail, _), chain = memo.cut("ep", ids_k, block_size, msgs_k)
            assert (blocks, tail, chain) == _scratch(ids_k, block_size, msgs_k)
            if before is not None and before.block_size == block_size and blocks and before.cut.blocks:
                reused += blocks[0] is before.cut.blocks[0]  # the same object: taken, not cut again
    assert reused >= len(cases) - 3


def test_it_keeps_at_most_its_capacity_and_bytes_and_forgets_ended_episodes() -> None:
    memo = PrefixMemo(capacity=3, max_bytes=10_000)
    for i in range(5):
        memo.cut(f"ep{i}", list(range(100)), 16, [{"role": "user", "content": "x"}])
    assert list(memo._last) == ["ep2", "ep3", "ep4"]
    memo.cut("big", list(range(2_000)), 16, [{"role": "user", "content": "y" * 3_000}])  # over max_bytes alone
    assert memo._bytes <= 10_000 or list(memo._last) == ["big"]
    memo.forget("big")
    memo.forget("never seen")
    assert "big" not in memo._last and memo._bytes == sum(e.nbytes for e in memo._last.values())


def test_steps_read_back_exactly_through_the_memo(tmp_path: Path) -> None:
    pool = Pool(f"sqlite:///{tmp_path / 'p.db'}", block_size=8)
    try:
        ep = Episode(episode_id=new_id("ep"), task="t")
        pool.add_episodes([ep])
        msgs: list[dict] = [{"role": "system", "content": "rules"}]
        ids: list[int] = list(range(20))
        sent = []
        for i, n in enumerate([1, 1.0, True, 2]):  # equal under ==, different JSON: each must read back as sent
            msgs = [*msgs, {"role": "tool", "content": "r", "n": n}]
            ids = ids + [100 + i] * 9
            sent.append(Step(step_id=new_id("step"), episode_id=ep.episode_id, index=i, policy="p", source=Source.whitebox,
                             prompt_messages=[dict(m) for m in msgs], prompt_ids=list(ids), response_ids=[5, 6]))
            pool.add_steps([sent[-1]])
        got = pool.query_steps(StepFilter(episode_id=ep.episode_id), with_tokens=True, order="episode")
        for s, g in zip(sent, got, strict=True):
            assert g.prompt_ids == s.prompt_ids and g.response_ids == s.response_ids
            assert [(k, repr(v)) for m in g.prompt_messages for k, v in sorted(m.items())] == \
                   [(k, repr(v)) for m in s.prompt_messages for k, v in sorted(m.items())]
    finally:
        pool.close()
