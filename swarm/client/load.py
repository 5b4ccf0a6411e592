"""Load clients for durability checks: many concurrent agents chatting through a gateway, each
step the server answered recorded as *acknowledged*.

:func:`agent` is one agent (an episode, then chat turns alternating plain and streamed calls,
the history growing each turn); :func:`load_then` runs ``clients`` of them, calls ``action``
(e.g. a kill -9 of the gateway) once ``after_acked`` steps are acknowledged, and waits for the
agents to finish (an agent ends at its first failed call). Comparing the acknowledged step ids
with the pool afterwards answers "was any acknowledged step lost?".

Used by ``tests/gateway/test_durability.py`` and ``benchmarks/reliability_bench.py``. It does not
start, kill or inspect the gateway or the pool itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx

__all__ = ["agent", "load_then"]


async def agent(url: str, acked: list[str], stop: asyncio.Event, turns: int | None) -> dict[str, Any] | None:
    """One agent: opens an episode and chats until ``turns`` are done, ``stop`` is set or a call fails.

    Appends each answered step id to ``acked``; returns the episode (id and key), None if none opened.
    """
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        try:
            ep = (await http.post("/v1/episodes", json={"task": "load"})).json()
        except httpx.HTTPError:
            return None
        headers = {"Authorization": f"Bearer {ep['api_key']}"}
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
        k = 0
        while not stop.is_set() and (turns is None or k < turns):
            stream = k % 2 == 1
            try:
                if stream:
                    text, step_id = "", None
                    async with http.stream("POST", "/v1/chat/completions", headers=headers, json={
                            "model": "default", "messages": msgs, "stream": True}) as r:
                        async for line in r.aiter_lines():
                            if line.startswith("data: {"):
                                chunk = httpx.Response(200, content=line[6:]).json()
                                for c in chunk.get("choices", []):
                                    text += c["delta"].get("content") or ""
                                step_id = (chunk.get("swarm") or {}).get("step_id") or step_id
                    if step_id is None:
                        break
                else:
                    r = await http.post("/v1/chat/completions", headers=headers,
                                        json={"model": "default", "messages": msgs})
                    if r.status_code != 200:
                        break
                    text, step_id = r.json()["choices"][0]["message"]["content"], r.json()["swarm"]["step_id"]
            except httpx.HTTPError:
                break
            acked.append(step_id)  # the server answered: this step is acknowledged
            msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": f"turn {k}"}]
            k += 1
        return ep


async def load_then(url: str, clients: int, after_acked: int, action: Callable[[], None], acked: list[str],
                    timeout_s: float = 60.0) -> list[dict[str, Any] | None]:
    """Run ``clients`` open-ended agents; once ``after_acked`` steps are acknowledged call ``action()``
    (mid-flight: some calls are generating or storing right now), then let every agent finish the call it
    is in and stop."""
    stop = asyncio.Event()
    tasks = [asyncio.create_task(agent(url, acked, stop, turns=None)) for _ in range(clients)]
    try:
        while len(acked) < after_acked:
            if all(t.done() for t in tasks):
                raise RuntimeError(f"every agent stopped after {len(acked)} acknowledged steps (< {after_acked})")
            await asyncio.sleep(0.02)
        action()
        stop.set()
        return await asyncio.wait_for(asyncio.gather(*tasks), timeout=timeout_s)
    finally:
        stop.set()
