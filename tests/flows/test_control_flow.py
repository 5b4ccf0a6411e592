"""Driving a waiting server from a client (#33): flows.train with train.wait_for_client=true is started, retuned,
paused, resumed and stopped through /v1/control by the SDK; another claim on its policy is refused; the run ends
cleanly with its events in MLflow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import mlflow
import pytest
from flow_waits import wait_for

from flows.shutdown import end_process
from flows.train import train_flow
from swarm.client import ClientError, SwarmClient
from swarm.errors import ConflictError
from swarm.pool import Pool
from swarm.pool.claims import holder_id
from swarm.stack import free_port
from swarm.train import load_latest_checkpoint

pytestmark = [pytest.mark.usefixtures("prefect_harness"), pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def _status(client: SwarmClient) -> dict[str, Any] | None:
    try:
        return client.control_status()
    except ClientError:
        return None


def test_client_starts_retunes_pauses_resumes_and_stops_a_waiting_run(flow_config, tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cfg = flow_config("train.wait_for_client=true", "runner=process", "runner.processes=0", f"gateway.port={port}",
                      "train.batch_timeout_s=60", "train.checkpoint_every=100")
    out = Path(cfg["train"]["out_dir"])
    result: dict[str, Any] = {}
    flow = threading.Thread(target=lambda: result.update(train_flow(cfg)), daemon=True)
    flow.start()
    worker: subprocess.Popen | None = None
    client = SwarmClient(url, retries=0)
    try:
        st = wait_for(lambda: _status(client), 60, "the waiting gateway", flow)
        assert st["state"] == "waiting" and st["holder"] is None
        assert not (out / "mlflow_run.json").exists()  # no MLflow run before a client starts one
        with pytest.raises(ClientError) as exc:  # a restart key is refused, the server keeps waiting
            client.start_run({"model.path": "elsewhere"})
        assert exc.value.status_code == 400 and "model.path" in str(exc.value)
        st = client.start_run({"train.updates": 50, "task.group_size": 4, "batching.min_groups": 1},
                              holder="test-client", lr=0.003)
        assert st["state"] == "running" and st["knobs"]["lr"] == 0.003 and st["updates_total"] == 50
        with pytest.raises(ClientError) as exc:
            client.start_run()
        assert exc.value.status_code == 409
        other = Pool(cfg["pool"]["url"])  # a second process training the policy on this pool is refused
        try:
            with pytest.raises(ConflictError, match="two runs cannot train one policy"):
                other.claim_policy("default", holder_id())
        finally:
            other.close()
        # the client runs the episodes itself (the server runs no workers: runner.processes=0)
        worker = subprocess.Popen([sys.executable, "-m", "swarm.client", "--server", url, "--task", "echo",
                                   "--workers", "4", "--group-size", "4", "--max-tokens", "8"],
                                  cwd=str(REPO), env={**os.environ, "PYTHONPATH": str(REPO)},
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: client.control_status()["policy_version"] >= 1, 90, "the first update", flow)
        client.retune(lr=0.01)
        applied = wait_for(lambda: client.control_status()["applied"], 60, "the lr change applied", flow)
        (change,) = applied
        assert change["knob"] == "lr" and change["value"] == 0.01 and change["version"] >= 1
        v_retune = change["version"]

        client.pause()  # an update already training when the pause came completes, then the loop holds
        v_paused = wait_for(lambda: (st := client.control_status())["held"] and st["policy_version"], 60,
                         "the loop holding", flow)
        time.sleep(3.0)
        st = client.control_status()
        assert st["state"] == "paused" and st["policy_version"] == v_paused, "an update ran while paused"
        client.resume()
        wait_for(lambda: client.control_status()["policy_version"] > v_paused, 60, "an update after resume", flow)
        st = client.stop_run()
        assert st["state"] == "stopping"
        flow.join(90)
        assert not flow.is_alive(), "the run did not end after stop"
    finally:
        client.close()
        if worker is not None:
            end_process(worker, 15)
    assert result["status"] == "KILLED", result  # stopped before train.updates, as Ctrl-C ends it
    pool = Pool(cfg["pool"]["url"])
    try:
        published = pool.latest_version("default")
        assert pool.trainer_claims() == []  # released at the end
    finally:
        pool.close()
    ckpt = load_latest_checkpoint(out / "checkpoints" / "default")
    assert ckpt is not None and ckpt["version"] == published > v_paused
    assert {g["lr"] for g in ckpt["optimizer"]["param_groups"]} == {0.01}  # the optimizer took the retune

    mc = mlflow.tracking.MlflowClient(tracking_uri=cfg["mlflow"]["tracking_uri"])
    run = mc.get_run(result["run_id"])
    assert run.info.status == "KILLED" and run.data.params["algo.lr"] == "0.003"  # the start override
    assert [(m.step, m.value) for m in mc.get_metric_history(run.info.run_id, "control/lr")] == [(v_retune, 0.01)]
    assert run.data.tags["control.lr"] == "0.01"
    path = mc.download_artifacts(run.info.run_id, "control_events.jsonl", str(tmp_path))
    events = [json.loads(line) for line in Path(path).read_text().splitlines()]
    assert [e["event"] for e in events] == ["start", "retune", "pause", "resume", "stop"], events
    assert events[0]["holder"] == "test-client" and events[1]["version"] == v_retune
    print(f"control flow: lr 0.003 -> 0.01 at version {v_retune}, paused at {v_paused}, stopped at {published}")
