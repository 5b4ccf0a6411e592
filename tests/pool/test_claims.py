"""Trainer claims (swarm.pool.claims): one process trains a policy on a pool; lapsed and dead holders free it."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from swarm.errors import ConflictError
from swarm.pool import Pool
from swarm.pool.claims import holder_alive, holder_id


def test_a_second_holder_is_refused_naming_the_first(pool_url: str) -> None:
    pool = Pool(pool_url)
    try:
        a, b = holder_id(), holder_id()
        pool.claim_policy("default", a)
        pool.claim_policy("default", a)  # the holder itself may claim again (a resumed session)
        with pytest.raises(ConflictError, match=f"by {a}.*two runs cannot train one policy") as exc:
            pool.claim_policy("default", b)
        assert exc.value.status_code == 409 and exc.value.context["policy"] == "default"
        pool.claim_policy("other", b)  # another policy on the same pool is free
        assert pool.heartbeat_claim("default", a) and not pool.heartbeat_claim("default", b)
        assert not pool.release_claim("default", b) and pool.release_claim("default", a)
        pool.claim_policy("default", b)
        assert {(r["policy"], r["holder"]) for r in pool.trainer_claims()} == {("default", b), ("other", b)}
    finally:
        pool.close()


def test_a_lapsed_claim_is_free_and_its_holder_learns_it(pool_url: str) -> None:
    pool = Pool(pool_url)
    try:
        a, b = holder_id(), holder_id()
        pool.claim_policy("default", a, ttl_s=0.2)
        time.sleep(0.3)
        pool.claim_policy("default", b)
        assert not pool.heartbeat_claim("default", a)
    finally:
        pool.close()


def test_a_dead_local_holder_frees_the_claim_at_once(pool_url: str) -> None:
    proc = subprocess.run([sys.executable, "-c", "from swarm.pool.claims import holder_id; print(holder_id())"],
                          capture_output=True, text=True, check=True)
    dead = proc.stdout.strip()
    assert not holder_alive(dead) and holder_alive(holder_id()) and holder_alive("elsewhere:1:x")
    pool = Pool(pool_url)
    try:
        pool.claim_policy("default", dead, ttl_s=3600)
        pool.claim_policy("default", holder_id())  # a crashed run's claim does not block its resume
    finally:
        pool.close()


def test_concurrent_claims_one_wins(pool_url: str) -> None:
    pools = [Pool(pool_url) for _ in range(6)]
    results: list[str] = []
    barrier = threading.Barrier(len(pools))

    def claim(p: Pool) -> None:
        barrier.wait()
        try:
            p.claim_policy("default", holder_id())
            results.append("ok")
        except ConflictError:
            results.append("409")

    threads = [threading.Thread(target=claim, args=(p,)) for p in pools]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p in pools:
        p.close()
    assert sorted(results) == ["409"] * 5 + ["ok"]
