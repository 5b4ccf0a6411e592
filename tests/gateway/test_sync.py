"""C4/C5 client agreement over HTTP: active clients, agreements, client-token auth, the SDK call."""

from __future__ import annotations

from swarm.client import SwarmClient
from swarm.pool import StepFilter


def test_agree_marks_active_clients_and_is_consumed(gateway) -> None:
    gateway.episode(client_id="w1")
    gateway.episode(client_id="w2")
    state = gateway.http.get("/v1/sync").json()
    assert state == {"active_clients": ["w1", "w2"], "agreed_clients": []}
    with SwarmClient(gateway.url) as client:
        assert client.agree("w2") == {"active_clients": ["w1", "w2"], "agreed_clients": ["w2"]}
    board = gateway.server.server.config.app.state.gateway.sync
    assert board.take() == {"w2"}
    assert gateway.http.get("/v1/sync").json()["agreed_clients"] == []
    assert gateway.pool.count_steps(StepFilter()) == 0  # agreeing stores nothing in the pool


def test_agree_needs_the_client_token_when_set(make_gateway) -> None:
    gw = make_gateway(client_token="s3cret-client-token")
    r = gw.post("/v1/sync/agree", json={"client_id": "w1"})
    assert r.status_code == 401 and r.json()["error"]["type"]
    r = gw.post("/v1/sync/agree", "s3cret-client-token", json={"client_id": "w1"})
    assert r.status_code == 200 and r.json()["agreed_clients"] == ["w1"]
    assert gw.post("/v1/sync/agree", "s3cret-client-token", json={"client_id": ""}).status_code == 400
