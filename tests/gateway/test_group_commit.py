"""Group commit and open-episode memory: concurrent calls (and episode opens and ends) share pool transactions,
one bad request in a batch fails alone, repeat calls skip the re-read, and two gateways on one pool stay
consistent through the version (head) check."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
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


class Held:
    """Wraps a pool batch method: records each call's items; the first call waits until ``release`` is set."""

    def __init__(self, fn: Callable[[list[Any]], list[Any]]) -> None:
        self.fn, self.calls = fn, []
        self.entered, self.release = threading.Event(), threading.Event()

    def __call__(self, items: list[Any]) -> list[Any]:
        self.calls.append(list(items))
        if len(self.calls) == 1:
            self.entered.set()
            assert self.release.wait(30)
        return self.fn(items)


async def _first_then_together(held: Held, batcher: Batcher, first: Awaitable[Any],
                               rest: list[Awaitable[Any]]) -> list[Any]:
    """``first`` alone (held in the pool), then ``rest`` all waiting for the next batch; their results in order."""
    head = asyncio.ensure_future(first)
    await asyncio.to_thread(held.entered.wait, 30)
    tail = [asyncio.ensure_future(r) for r in rest]
    while len(batcher._pending) < len(rest):  # every one of them submitted
        await asyncio.sleep(0.01)
    held.release.set()
    return [await head, *await asyncio.gather(*tail)]


def test_concurrent_opens_and_ends_share_transactions_and_a_bad_end_fails_alone(
        make_gateway: Callable[..., Any], tmp_path: Path) -> None:
    pool = Pool(f"sqlite:///{tmp_path / 'pool.db'}")
    opens, ends = Held(pool.add_episodes), Held(pool.end_episodes)
    pool.add_episodes, pool.end_episodes = opens, ends  # the gateway's batchers take these
    gw = make_gateway(pool=pool)
    state = _state(gw)

    async def main() -> tuple[list[httpx.Response], list[httpx.Response]]:
        async with httpx.AsyncClient(base_url=gw.url, timeout=60) as http:
            def begin() -> Awaitable[httpx.Response]:
                return http.post("/v1/episodes", json={"task": "gc"})

            opened = await _first_then_together(opens, state.episode_opener, begin(), [begin() for _ in range(8)])
            eps = [r.json() for r in opened]

            def end(ep: dict[str, Any]) -> Awaitable[httpx.Response]:
                return http.post(f"/v1/episodes/{ep['episode_id']}/end", json={"reward": 1.0},
                                 headers={"Authorization": f"Bearer {ep['api_key']}"})

            ended = await _first_then_together(ends, state.episode_ender, end(eps[0]),
                                               [end(ep) for ep in eps[1:]] + [end(eps[4])])  # eps[4] ended twice
            return opened, ended

    opened, ended = asyncio.run(main())
    assert [r.status_code for r in opened] == [200] * 9
    assert [len(c) for c in opens.calls] == [1, 8]  # the 8 concurrent opens: one transaction
    ids = [r.json()["episode_id"] for r in opened]
    assert {e.episode_id for c in opens.calls for e in c} == set(ids)

    # the 9 concurrent ends shared a batch; it failed (eps[4] twice), so each was retried alone
    first, batch, *alone = [[e.episode_id for e in c] for c in ends.calls]
    assert first == ids[:1] and sorted(batch) == sorted(ids[1:] + ids[4:5])
    assert alone == [[i] for i in batch]
    codes = [r.status_code for r in ended]
    assert codes[:4] + codes[5:9] == [200] * 8 and sorted([codes[4], codes[9]]) == [200, 409]
    for ep_id in ids:  # answered => committed
        ep = pool.get_episode(ep_id)
        assert (ep.status.value, ep.reward) == ("finished", 1.0)


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


def test_a_writer_holding_the_lock_does_not_stall_the_gateway(gateway: Any) -> None:
    """SQLite steps are written on the event loop, but never by waiting for another writer's lock there: the call
    waits on a thread while the gateway goes on answering, and is stored once the lock is free."""
    import sqlite3

    key = gateway.episode("lock")["api_key"]
    assert gateway.chat(key, [SYSTEM, {"role": "user", "content": "first"}]).status_code == 200
    other = sqlite3.connect(gateway.pool.engine.url.database, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # another process's writer (a trainer) holds the lock
        out: dict[str, Any] = {}
        call = threading.Thread(target=lambda: out.update(r=gateway.chat(key, [SYSTEM, {"role": "user", "content": "x"}])))
        call.start()
        time.sleep(0.5)
        assert call.is_alive()  # its write waits for the lock ...
        for _ in range(3):  # ... and the gateway answers meanwhile
            assert gateway.http.get("/v1/models", timeout=5).status_code == 200
        other.execute("COMMIT")
        call.join(30)
        assert out["r"].status_code == 200, out["r"].text
    finally:
        other.close()
    step_id = out["r"].json()["swarm"]["step_id"]
    assert gateway.pool.get_step(step_id).index == 1
