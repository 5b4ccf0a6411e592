"""``python -m flows.serve``: validated like a training run, assembled through flows.components.start_gateway."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx

from flows.serve import REPO, spawn


def test_serve_starts_through_start_gateway_and_honours_log_level(tmp_path: Path) -> None:
    gw = spawn("model=echo", f"pool.url=sqlite:///{tmp_path / 'pool.db'}", "gateway.log_level=info")
    try:
        assert httpx.get(gw.url + "/health", timeout=10).status_code == 200
    finally:
        gw.stop()
    assert "Application startup complete" in gw.log.read_text()  # uvicorn at info, as configured


def test_serve_refuses_a_mistyped_key_in_one_line(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "flows.serve", "model=echo", "+gateway.prot=1", "+model.dely_s=1"],
                          cwd=tmp_path, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    # the sections around the model first (before a backend's module, maybe torch, is imported), then the model
    assert proc.stderr.strip() == "config error: gateway.prot: unknown key (did you mean gateway.port?)"
    proc = subprocess.run([sys.executable, "-m", "flows.serve", "model=echo", "+model.dely_s=1"],
                          cwd=tmp_path, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == "config error: model.dely_s: unknown key (did you mean model.delay_s?)"


def test_sigterm_stops_a_server_started_with_ctrl_c_ignored(tmp_path: Path) -> None:
    # a job started in the background of a script, or under nohup, starts with SIGINT ignored: SIGTERM must still stop it
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        gw = spawn("model=echo", f"pool.url=sqlite:///{tmp_path / 'pool.db'}")
    finally:
        signal.signal(signal.SIGINT, old)
    try:
        gw.proc.send_signal(signal.SIGTERM)
        assert gw.proc.wait(timeout=30) == 0, gw.log.read_text()[-2000:]
    finally:
        gw.stop()
