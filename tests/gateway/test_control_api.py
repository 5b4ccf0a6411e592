"""/v1/control over HTTP: admin-token auth (401/403), OpenAI-shaped 400 naming the knob, 409, the SDK and CLI."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from swarm.app import GatewaySettings, create_app
from swarm.client import ClientError, SwarmClient
from swarm.client.control import main as control_main
from swarm.control import Control
from swarm.errors import ValidationError
from swarm.policy.echo import EchoBackend
from swarm.pool import Pool
from swarm.stack import ServerThread

ADMIN = "adm-secret"
KNOBS = {"lr": 1e-3, "strategy": "groups", "min_groups": 1, "min_episodes": 1, "max_staleness": 1,
         "eval_every": 0, "updates": 5}


def _check(overrides):
    if "model.path" in overrides:
        raise ValidationError("model.path: fixed once the server waits; restart python -m flows.train",
                              param="model.path")
    return dict(overrides), {"updates": overrides.get("train.updates", 5)}


@pytest.fixture
def served(tmp_path: Path):
    pool = Pool(f"sqlite:///{tmp_path / 'pool.db'}")
    control = Control(KNOBS, wait_for_client=True, check_start=_check)
    server = ServerThread(create_app(pool, EchoBackend(), GatewaySettings(admin_token=ADMIN), control=control)).start()
    try:
        yield server.url, control
    finally:
        server.stop()
        pool.close()


def _post(url: str, path: str, token: str | None = ADMIN, **kw) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.post(url + path, headers=headers, timeout=10, **kw)


def test_every_route_needs_the_admin_token(served) -> None:
    url, _ = served
    routes = [("GET", "/v1/control"), ("POST", "/v1/control/start"), ("POST", "/v1/control/pause"),
              ("POST", "/v1/control/resume"), ("POST", "/v1/control/retune"), ("POST", "/v1/control/stop")]
    for method, path in routes:
        r = httpx.request(method, url + path, json={}, timeout=10)
        assert r.status_code == 401, (path, r.text)
        assert r.json()["error"]["code"] == "admin_token_required"
        r = httpx.request(method, url + path, json={}, headers={"Authorization": "Bearer wrong"}, timeout=10)
        assert r.status_code == 403, (path, r.text)
    assert httpx.get(url + "/v1/control", headers={"Authorization": f"Bearer {ADMIN}"}).json()["state"] == "waiting"


def test_start_retune_pause_resume_stop_and_refusals(served) -> None:
    url, control = served
    r = _post(url, "/v1/control/retune", json={"lr": 0.1})
    assert r.status_code == 409 and r.json()["error"]["type"] == "conflict_error"
    r = _post(url, "/v1/control/start", json={"overrides": {"model.path": "other"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model.path"
    assert "restart" in r.json()["error"]["message"]
    r = _post(url, "/v1/control/start", json={"overrides": {"train.updates": 7}, "holder": "laptop"})
    assert r.status_code == 200 and r.json()["state"] == "running" and r.json()["updates_total"] == 7
    r = _post(url, "/v1/control/start", json={})
    assert r.status_code == 409 and "two runs cannot train one policy" in r.json()["error"]["message"]
    r = _post(url, "/v1/control/retune", json={"algo.clip_eps": 0.3})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "algo.clip_eps" and err["code"] == "unsafe_knob"
    assert err["message"].startswith("algo.clip_eps:") and "lr (algo.lr)" in err["message"]
    r = _post(url, "/v1/control/retune", json={"lr": -1})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("lr=-1")
    r = _post(url, "/v1/control/retune", json={"lr": 5e-4, "batching.strategy": "episodes"})
    assert r.status_code == 200 and [p["knob"] for p in r.json()["pending"]] == ["lr", "strategy"]
    assert _post(url, "/v1/control/resume").status_code == 200  # running: a no-op
    assert _post(url, "/v1/control/pause").json()["state"] == "paused"
    assert _post(url, "/v1/control/resume").json()["state"] == "running"
    assert _post(url, "/v1/control/stop").json()["state"] == "stopping"
    assert _post(url, "/v1/control/pause").status_code == 409
    assert [ch.knob for ch in control.take_changes()] == ["lr", "strategy"]


def test_a_gateway_without_run_control_answers_404(make_gateway) -> None:
    gw = make_gateway()
    r = gw.http.get("/v1/control")
    assert r.status_code == 404 and r.json()["error"]["code"] == "no_run_control"


def test_sdk_and_cli(served, capsys) -> None:
    url, control = served
    with SwarmClient(url, admin_token=ADMIN) as c:
        assert c.control_status()["state"] == "waiting"
        st = c.start_run({"train.updates": 4}, lr=0.01)
        assert st["state"] == "running" and control.overrides == {"train.updates": 4, "algo.lr": 0.01}
        assert c.retune(lr=0.02)["pending"][0]["value"] == 0.02
        assert c.pause()["state"] == "paused" and c.resume()["state"] == "running"
        with pytest.raises(ClientError) as exc:
            c.retune(temperature=2)
        assert exc.value.status_code == 400 and "temperature" in str(exc.value)
    with SwarmClient(url) as anonymous, pytest.raises(ClientError) as exc:
        anonymous.control_status()
    assert exc.value.status_code == 401
    assert control_main(["--server", url, "--token", ADMIN, "retune", "min_groups=2", "max_staleness=null"]) == 0
    assert '"min_groups"' in capsys.readouterr().out
    assert control_main(["--server", url, "--token", ADMIN, "retune", "strategy=huge"]) == 1
    assert "strategy='huge'" in capsys.readouterr().err
    out = subprocess.run([sys.executable, "-m", "swarm.client.control", "--server", url, "--token", ADMIN, "stop"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and '"state": "stopping"' in out.stdout


def test_concurrent_starts_over_http_one_wins(served) -> None:
    url, _ = served
    codes: list[int] = []
    threads = [threading.Thread(target=lambda: codes.append(_post(url, "/v1/control/start", json={}).status_code))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(codes) == [200] + [409] * 7
