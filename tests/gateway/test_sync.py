"""C4/C5 client agreement over HTTP: active clients, agreements kept in the pool, client-token auth, the SDK call."""

from __future__ import annotations

from swarm.client import SwarmClient
from swarm.pool import Pool, StepFilter


def test_agree_marks_active_clients_and_is_consumed(gateway) -> None:
    gateway.episode(client_id="w1")
    gateway.episode(client_id="w2")
    state = gateway.http.get("/v1/sync").json()
    assert state == {"active_clients": ["w1", "w2"], "agreed_clients": []}
    with SwarmClient(gateway.url) as client:
        assert client.agree("w2") == {"active_clients": ["w1", "w2"], "agreed_clients": ["w2"]}
    assert gateway.pool.take_agreements() == {"w2"}
    assert gateway.http.get("/v1/sync").json()["agreed_clients"] == []
    assert gateway.pool.count_steps(StepFilter()) == 0  # an agreement is not a step
    assert [(a["client_id"], a["taken_at"] is not None) for a in gateway.pool.agreement_log()] == [("w2", True)]


def test_agree_needs_the_client_token_when_set(make_gateway) -> None:
    gw = make_gateway(client_token="s3cret-client-token")
    r = gw.post("/v1/sync/agree", json={"client_id": "w1"})
    assert r.status_code == 401 and r.json()["error"]["type"]
    r = gw.post("/v1/sync/agree", "s3cret-client-token", json={"client_id": "w1"})
    assert r.status_code == 200 and r.json()["agreed_clients"] == ["w1"]
    assert gw.post("/v1/sync/agree", "s3cret-client-token", json={"client_id": ""}).status_code == 400
    assert gw.post("/v1/sync/agree", "s3cret-client-token", json={"client_id": "x" * 129}).status_code == 400


def test_two_gateways_on_one_pool_see_each_others_clients_and_agreements(make_gateway, tmp_path) -> None:
    """Agreements live in the pool: a client of gateway A and one of gateway B agree; both gateways and the
    trainer (a third Pool on the same file) see both, and one take consumes them everywhere."""
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    a, b = make_gateway(pool=Pool(url)), make_gateway(pool=Pool(url))
    a.episode(client_id="on-a")
    b.episode(client_id="on-b")
    assert a.post("/v1/sync/agree", json={"client_id": "on-a"}).json()["agreed_clients"] == ["on-a"]
    both = {"active_clients": ["on-a", "on-b"], "agreed_clients": ["on-a"]}
    assert b.http.get("/v1/sync").json() == both
    assert b.post("/v1/sync/agree", json={"client_id": "on-b"}).json()["agreed_clients"] == ["on-a", "on-b"]
    trainer = Pool(url)
    try:
        assert trainer.sync_clients() == ({"on-a", "on-b"}, {"on-a", "on-b"})
        assert trainer.take_agreements() == {"on-a", "on-b"}
    finally:
        trainer.close()
    for gw in (a, b):
        assert gw.http.get("/v1/sync").json() == {"active_clients": ["on-a", "on-b"], "agreed_clients": []}
