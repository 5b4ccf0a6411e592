"""A flow's gateway freezes the heap it started with (swarm/stack.py ``freeze_heap``) and undoes it when it stops.

What the freeze must keep: the gateway serves, cyclic garbage made while frozen is still collected without anyone
calling ``gc.collect()``, and after ``stop()`` the collector is as it was (a test process runs many flows).
"""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import httpx

from swarm.policy.echo import EchoBackend
from swarm.pool import Pool
from swarm.stack import start_stack


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the collector frees it


def test_the_heap_is_frozen_while_the_gateway_serves_and_cycles_are_still_collected(tmp_path: Path) -> None:
    before = gc.get_threshold()
    pool = Pool(f"sqlite:///{tmp_path / 'p.db'}")
    stack = start_stack(pool, EchoBackend(), freeze_heap=True)
    try:
        assert gc.get_freeze_count() > 0
        ep = httpx.post(f"{stack.url}/v1/episodes", json={"task": "t"}).json()
        r = httpx.post(f"{stack.url}/v1/chat/completions", headers={"Authorization": f"Bearer {ep['api_key']}"},
                       json={"model": "default", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200
        first = _Node()
        gone = weakref.ref(first)
        del first
        for _ in range(30_000):  # past the collector's threshold: a young collection runs on its own
            _Node()
        assert gone() is None
    finally:
        stack.stop()
        pool.close()
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before
