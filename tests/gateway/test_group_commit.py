"""Group commit and open-episode memory: concurrent calls share pool transactions, repeat calls skip the
re-read, and two gateways on one pool stay consistent through the version (head) check."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx

from swarm.gateway.batcher import Batcher
from swarm.gateway.state import GatewayState
from swarm.pool import Pool

SYSTEM = {"role": "system", "content": "You are a test agent."}


def _state(gw: Any) -> GatewayState:
    return gw.server.server.config.app.state.gateway


def _turns(gw: Any, key: str, n: int) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": "start"}]
    out = []
    for k in range(n):
        r = gw.chat(key, msgs)
        assert r.status_code == 200, r.text
        out.append(r.json())
        msgs += [r.json()["choices"][0]["message"], {"role": "user", "content": f"turn {k}"}]
    return out


def test_batcher_one_failing_item_fails_alone() -> None:
    runs: list[list[int]] = []

    async def run(items: list[int]) -> list[int]:
        runs.append(items)
        await asyncio.sleep(0.01)
        if 13 in items:
            raise ValueError("13 is refused")
        return [i * 2 for i in items]

    async def main() -> list[Any]:
        b: Batcher[int, int] = Batcher(run)
        return await asyncio.gather(*[b.submit(i) for i in range(20)], return_exceptions=True)

    results = asyncio.run(main())
    assert [r for i, r in enumerate(results) if i != 13] == [i * 2 for i in range(20) if i != 13]
    assert isinstance(results[13], ValueError)
    assert runs[0] == list(range(20))  # submitted together: one batch
    assert runs[1:] == [[i] for i in range(20)]  # it failed: each item alone, so only 13 fails


def test_concurrent_calls_share_transactions_and_all_are_stored(gateway: Any) -> None:
    clients, turns = 16, 3

    async def agent(http: httpx.AsyncClient) -> tuple[str, list[str]]:
        ep = (await http.post("/v1/episodes", json={"task": "gc"})).json()
        headers = {"Authorization": f"Bearer {ep['api_key']}"}
        msgs: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": "go"}]
        ids = []
        for k in range(turns):
            r = await http.post("/v1/chat/completions", headers=headers, json={"model": "default", "messages": msgs})
            assert r.status_code == 200, r.text
            ids.append(r.json()["swarm"]["step_id"])
            msgs += [r.json()["choices"][0]["message"], {"role": "user", "content": f"t{k}"}]
        return ep["episode_id"], ids

    async def main() -> list[tuple[str, list[str]]]:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as http:
            return await asyncio.gather(*[agent(http) for _ in range(clients)])

    eps = asyncio.run(main())
    writer = _state(gateway).step_writer
    assert writer.items == clients * turns
    assert writer.batches < writer.items  # some calls shared a transaction
    for ep_id, ids in eps:
        steps = sorted((s for s in gateway.pool.query_steps(limit=1000) if s.episode_id == ep_id), key=lambda s: s.index)
        assert [s.step_id for s in steps] == ids
        assert [s.index for s in steps] == list(range(turns))
        assert all(s.prefix_consistent for s in steps[1:])
        assert [s.parent_step_id for s in steps[1:]] == ids[:-1]


def test_repeat_calls_use_memory_not_a_reread(gateway: Any) -> None:
    ep = gateway.episode()
    _turns(gateway, ep["api_key"], 4)
    episodes = _state(gateway).episodes
    assert (episodes.hits, episodes.misses) == (3, 0)


def test_two_gateways_one_pool_alternating_turns(make_gateway: Callable[..., Any], tmp_path: Any) -> None:
    secret = "s" * 32
    a = make_gateway(secret=secret)
    b = make_gateway(pool=Pool(f"sqlite:///{tmp_path / 'pool.db'}"), secret=secret)
    key = a.episode()["api_key"]
    msgs: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": "start"}]
    ids = []
    for k in range(6):
        gw = a if k % 2 == 0 else b
        r = gw.chat(key, msgs)
        assert r.status_code == 200, r.text
        ids.append(r.json()["swarm"]["step_id"])
        assert r.json()["swarm"]["prefix_consistent"] is (None if k == 0 else True)
        msgs += [r.json()["choices"][0]["message"], {"role": "user", "content": f"turn {k}"}]
    steps = sorted(a.pool.query_steps(limit=100, with_tokens=True), key=lambda s: s.index)
    assert [s.step_id for s in steps] == ids and [s.index for s in steps] == list(range(6))
    for prev, s in zip(steps, steps[1:], strict=False):
        assert s.prompt_ids[: len(prev.prompt_ids) + len(prev.response_ids)] == prev.prompt_ids + prev.response_ids
    # each gateway's memory was stale after the other one's write: the head check caught it every time
    assert _state(a).episodes.misses == 2 and _state(b).episodes.misses == 3
    # an episode ended through one gateway is refused by the other, whatever it remembers
    assert b.post(f"/v1/episodes/{steps[0].episode_id}/end", key, json={"reward": 1.0}).status_code == 200
    r = a.chat(key, msgs)
    assert r.status_code == 403 and r.json()["error"]["code"] == "episode_ended"
