"""Episode api keys (signed, opaque, shared-secret) and the client / admin tokens."""

from __future__ import annotations

import base64
from typing import Any

import openai
import pytest

from swarm.gateway import KeySigner
from swarm.policy.echo import EchoBackend


def test_keys_roundtrip_and_are_opaque() -> None:
    signer = KeySigner(b"s" * 32)
    ep = "ep-0123456789abcdef0123456789abcdef"
    k1, k2 = signer.issue(ep), signer.issue(ep)
    assert k1 != k2 and signer.verify(k1) == signer.verify(k2) == ep
    body = base64.urlsafe_b64decode(k1.removeprefix("sk-swarm-") + "==")
    assert b"0123456789abcdef" not in body and ep not in k1
    assert KeySigner(b"t" * 32).verify(k1) is None  # another secret
    for bad in ("", "sk-swarm-", "sk-swarm-x", k1[:-2], k1 + "A", "sk-swarm-" + "A" * 80):
        assert signer.verify(bad) is None


def test_episode_key_is_bound_to_its_episode(gateway: Any) -> None:
    a, b = gateway.episode(), gateway.episode()
    r = gateway.chat(a["api_key"], [{"role": "user", "content": "x"}])
    assert r.status_code == 200 and r.json()["swarm"]["episode_id"] == a["episode_id"]
    steps = gateway.pool.query_steps()
    assert [s.episode_id for s in steps] == [a["episode_id"]]
    for path in ("heartbeat", "end", "abort"):
        assert gateway.post(f"/v1/episodes/{b['episode_id']}/{path}", a["api_key"], json={}).status_code == 403
    r = gateway.post("/v1/steps", a["api_key"], json={"steps": [
        {"episode_id": b["episode_id"], "prompt_ids": [1], "response_ids": [2]}]})
    assert r.status_code == 403
    assert gateway.pool.get_episode(b["episode_id"]).status.value == "open"


def test_forged_key_is_rejected_by_the_openai_sdk(gateway: Any) -> None:
    ep = gateway.episode()
    forged = KeySigner(b"attacker-secret-" * 2).issue(ep["episode_id"])
    client = openai.OpenAI(base_url=ep["base_url"], api_key=forged, max_retries=0)
    with pytest.raises(openai.AuthenticationError) as info:
        client.chat.completions.create(model="default", messages=[{"role": "user", "content": "x"}])
    assert info.value.body["code"] == "invalid_api_key"
    assert gateway.pool.count_steps() == 0


def test_gateways_sharing_a_secret_and_pool_accept_each_others_keys(make_gateway: Any) -> None:
    g1 = make_gateway(secret="shared-secret-0123456789")
    g2 = make_gateway(pool=g1.pool, secret="shared-secret-0123456789")
    g3 = make_gateway(pool=g1.pool)  # its own random secret
    ep = g1.episode()
    assert g2.chat(ep["api_key"], [{"role": "user", "content": "x"}]).status_code == 200
    assert g3.chat(ep["api_key"], [{"role": "user", "content": "x"}]).status_code == 401


def test_client_and_admin_tokens(make_gateway: Any) -> None:
    gw = make_gateway(EchoBackend(), client_token="cli-token", admin_token="adm-token")
    assert gw.http.post("/v1/episodes", json={"task": "t"}).status_code == 401
    assert gw.post("/v1/episodes", "wrong", json={"task": "t"}).status_code == 401
    ep = gw.episode(token="cli-token")
    assert gw.episode(token="adm-token")["api_key"]
    # an episode key is not a client token
    assert gw.post("/v1/episodes", ep["api_key"], json={"task": "t"}).status_code == 401
    # services post events with the client token; leases need the admin token
    assert gw.post("/v1/events", "cli-token", json={"episode_id": ep["episode_id"], "name": "tick"}).status_code == 200
    assert gw.post("/v1/events", None, json={"episode_id": ep["episode_id"], "name": "tick"}).status_code == 401
    assert gw.post("/v1/pool/leases", "cli-token", json={"max_steps": 1}).status_code == 403
    assert gw.post("/v1/pool/leases", "adm-token", json={"max_steps": 1}).status_code == 200
    assert gw.post("/v1/pool/labels", "cli-token", json={"target": "episode", "target_id": ep["episode_id"],
                                                        "label": "x"}).status_code == 403
    assert gw.post("/v1/pool/labels", "adm-token", json={"target": "episode", "target_id": ep["episode_id"],
                                                        "label": "x"}).status_code == 200
