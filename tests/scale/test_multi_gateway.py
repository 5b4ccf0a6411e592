"""Several gateways, one pool: two gateway processes on PostgreSQL share episodes, keys and leases."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from scale_helpers import GatewayProcess, start_gateway

from swarm.app import GatewaySettings, create_app
from swarm.policy.echo import EchoBackend
from swarm.pool import Pool, StepFilter
from swarm.stack import ServerThread

pytestmark = pytest.mark.postgres

SECRET = secrets.token_hex(32)
SYSTEM = {"role": "system", "content": "You are a relay agent."}


@pytest.fixture(scope="module")
def gateways(pg_url: str) -> Iterator[tuple[GatewayProcess, GatewayProcess]]:
    Pool(pg_url).close()  # create the schema once, before two processes race for it
    a = start_gateway(pg_url, SECRET)
    try:
        b = start_gateway(pg_url, SECRET)
    except BaseException:
        a.stop()
        raise
    yield a, b
    a.stop()
    b.stop()


@pytest.fixture(scope="module")
def pool(pg_url: str) -> Iterator[Pool]:
    p = Pool(pg_url)
    yield p
    p.close()


def chat(url: str, key: str, messages: list[dict], **kw) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                      json={"model": "default", "messages": messages, "max_tokens": 64, **kw}, timeout=30)


def begin(url: str, **body) -> dict:
    r = httpx.post(url + "/v1/episodes", json={"task": "relay", **body}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def test_gateways_are_separate_processes_on_one_pool(gateways) -> None:
    a, b = gateways
    assert a.url != b.url and a.proc.pid != b.proc.pid
    for gw in gateways:
        assert httpx.get(gw.url + "/health").json()["status"] == "ok"


def test_episode_begun_on_one_gateway_continues_on_the_other(gateways, pool: Pool) -> None:
    a, b = gateways
    ep = begin(a.url)
    assert ep["base_url"].startswith(a.url)
    turn1 = [SYSTEM, {"role": "user", "content": "first turn on gateway A"}]
    r1 = chat(a.url, ep["api_key"], turn1)
    assert r1.status_code == 200, r1.text
    reply1 = r1.json()["choices"][0]["message"]["content"]
    turn2 = turn1 + [{"role": "assistant", "content": reply1}, {"role": "user", "content": "second turn on B"}]
    r2 = chat(b.url, ep["api_key"], turn2)  # a key issued by A verifies on B
    assert r2.status_code == 200, r2.text
    assert r2.json()["swarm"]["prefix_consistent"] is True  # keyed on the stored previous step, not on A's memory
    turn3 = turn2 + [{"role": "assistant", "content": r2.json()["choices"][0]["message"]["content"]},
                     {"role": "user", "content": "third turn back on A"}]
    r3 = chat(a.url, ep["api_key"], turn3)
    assert r3.status_code == 200 and r3.json()["swarm"]["prefix_consistent"] is True
    assert httpx.post(f"{b.url}/v1/episodes/{ep['episode_id']}/heartbeat",
                      headers={"Authorization": f"Bearer {ep['api_key']}"}).status_code == 200
    end = httpx.post(f"{b.url}/v1/episodes/{ep['episode_id']}/end", json={"reward": 1.0},
                     headers={"Authorization": f"Bearer {ep['api_key']}"})
    assert end.status_code == 200, end.text

    s1, s2, s3 = sorted(pool.query_steps(StepFilter(episode_id=ep["episode_id"]), limit=10, with_tokens=True),
                        key=lambda s: s.index)
    assert [s.index for s in (s1, s2, s3)] == [0, 1, 2]
    assert s2.parent_step_id == s1.step_id and s3.parent_step_id == s2.step_id
    assert s2.prompt_ids[: len(s1.prompt_ids) + len(s1.response_ids)] == s1.prompt_ids + s1.response_ids
    assert s3.prompt_ids[: len(s2.prompt_ids) + len(s2.response_ids)] == s2.prompt_ids + s2.response_ids
    assert pool.get_episode(ep["episode_id"]).status.value == "finished"
    # ended on B: A refuses to generate with the key
    late = chat(a.url, ep["api_key"], turn3)
    assert late.status_code == 403 and late.json()["error"]["code"] == "episode_ended"


def test_keys_verify_only_under_the_shared_secret(gateways, pg_url: str) -> None:
    a, _ = gateways
    ep = begin(a.url)
    other_pool = Pool(pg_url)
    other = ServerThread(create_app(other_pool, EchoBackend(), GatewaySettings(secret=secrets.token_bytes(32)))).start()
    try:
        r = chat(other.url, ep["api_key"], [{"role": "user", "content": "hi"}])
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    finally:
        other.stop()
        other_pool.close()


def _fill(gateways, groups: int, group_size: int, tag: str) -> list[str]:
    """``groups`` finished, rewarded groups, their episodes alternating between the gateways."""
    step_ids = []
    for g in range(groups):
        for i in range(group_size):
            gw = gateways[(g + i) % 2]
            ep = begin(gw.url, group_id=f"{tag}-{g}")
            r = chat(gw.url, ep["api_key"], [{"role": "user", "content": f"{tag} {g} {i}"}])
            assert r.status_code == 200, r.text
            step_ids.append(r.json()["swarm"]["step_id"])
            gw2 = gateways[(g + i + 1) % 2]
            assert httpx.post(f"{gw2.url}/v1/episodes/{ep['episode_id']}/end", json={"reward": float(i)},
                              headers={"Authorization": f"Bearer {ep['api_key']}"}).status_code == 200
    return step_ids


def test_leases_are_exclusive_across_gateway_processes(gateways, pool: Pool) -> None:
    all_ids = set(_fill(gateways, groups=12, group_size=2, tag="lease"))
    taken: dict[str, list[tuple[str, list[str]]]] = {"a": [], "b": []}
    barrier = threading.Barrier(2)

    def drain(name: str, url: str) -> None:
        barrier.wait()
        with httpx.Client(base_url=url, timeout=30) as http:
            while True:
                r = http.post("/v1/pool/leases", json={"filter": {"task": "relay", "reward_status": "final",
                                                                  "episode_status": "finished"},
                                                       "max_groups": 1, "ttl_s": 60})
                assert r.status_code == 200, r.text
                body = r.json()
                if not body["steps"]:
                    return
                taken[name].append((body["lease_id"], [s["step_id"] for s in body["steps"]]))
                time.sleep(0.02)  # under load one drainer could take all 12 before the other's first call

    threads = [threading.Thread(target=drain, args=(n, gw.url)) for n, gw in zip("ab", gateways, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    leased = [sid for leases in taken.values() for _, ids in leases for sid in ids]
    assert len(leased) == len(set(leased))  # no step in two leases
    assert all_ids <= set(leased)  # every step handed out
    assert taken["a"] and taken["b"]  # both processes really competed

    # a lease taken through A is acked through B; the steps are then consumed for good
    lease_id, ids = taken["a"][0]
    r = httpx.post(f"{gateways[1].url}/v1/pool/leases/{lease_id}/ack", json={"consumed_version": 1})
    assert r.status_code == 200 and r.json()["acked"] == len(ids)
    consumed = {s.step_id for s in pool.query_steps(StepFilter(consumed=True), limit=1000)}
    assert set(ids) <= consumed
    again = httpx.post(f"{gateways[0].url}/v1/pool/leases/{lease_id}/ack", json={"consumed_version": 1})
    assert again.status_code == 409


def test_expired_lease_returns_its_steps_to_the_other_gateway(gateways) -> None:
    a, b = gateways
    ids = set(_fill(gateways, groups=1, group_size=2, tag="expire"))
    body = {"filter": {"task": "relay", "group_id": "expire-0"}, "max_groups": 1, "ttl_s": 0.5}
    first = httpx.post(a.url + "/v1/pool/leases", json=body).json()
    assert {s["step_id"] for s in first["steps"]} == ids
    assert httpx.post(b.url + "/v1/pool/leases", json=body).json()["steps"] == []  # still leased
    time.sleep(0.8)
    second = httpx.post(b.url + "/v1/pool/leases", json=body).json()
    assert {s["step_id"] for s in second["steps"]} == ids  # the trainer behind A "died"; B gets them
    assert httpx.post(f"{a.url}/v1/pool/leases/{first['lease_id']}/ack",
                      json={"consumed_version": 1}).status_code == 409


def test_extra_gateway_follows_published_versions(pg_url: str, pool: Pool) -> None:
    from swarm.records import PolicyVersion

    follower = start_gateway(pg_url, SECRET, "gateway.follow_versions_s=0.2")
    try:
        assert httpx.get(follower.url + "/health").json()["versions"] == {"default": 0}
        pool.add_policy_version(PolicyVersion(policy="default", version=1))  # the trainer published
        deadline = time.monotonic() + 20
        while httpx.get(follower.url + "/health").json()["versions"]["default"] != 1:
            assert time.monotonic() < deadline, "the extra gateway never picked up version 1"
            time.sleep(0.1)
        ep = begin(follower.url)
        r = chat(follower.url, ep["api_key"], [{"role": "user", "content": "which version?"}])
        assert r.json()["swarm"]["policy_version"] == 1
    finally:
        follower.stop()


def test_concurrent_calls_of_one_episode_on_two_gateways_get_distinct_indices(gateways, pool) -> None:
    """Both gateways write one episode at once; the pool numbers the steps, so no index repeats."""
    a, b = gateways
    ep = begin(a.url)
    results: list[int] = []

    def call(url: str, k: int) -> None:
        r = chat(url, ep["api_key"], [SYSTEM, {"role": "user", "content": f"parallel {k}"}])
        results.append(r.status_code)

    threads = [threading.Thread(target=call, args=((a, b)[k % 2].url, k)) for k in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [200] * 12
    steps = pool.query_steps(StepFilter(episode_id=ep["episode_id"]), limit=100)
    assert sorted(s.index for s in steps) == list(range(12))
