"""README's "compare runs" screenshot, from a real comparison of two real runs.

Runs ``python -m flows.train`` twice on the CPU default (``algo.lr=3e-3`` and ``algo.lr=1e-3``,
``--updates`` each) into one temporary MLflow store, serves it with ``mlflow server`` on
127.0.0.1, and saves MLflow's compare view of the two runs (``docs/img/mlflow-compare.png``) with
Debian's headless chromium (playwright):

    .venv/bin/python tools/mlflow_compare_screenshot.py [--updates 8] [--out docs/img]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Debian's chromium, loopback only (shared/ENVIRONMENT.md "Browser tests"; as tests/dashboard/conftest.py)
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
    "--disable-component-update", "--no-first-run", "--disable-sync",
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE localhost , EXCLUDE 127.0.0.1",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(tmp: Path, uri: str, lr: str, updates: int) -> str:
    """One real flows.train run; returns its MLflow run id."""
    out = tmp / f"run-lr{lr}"
    env = {**os.environ, "PYTHONPATH": str(REPO), "PREFECT_HOME": str(tmp / "prefect")}
    subprocess.run([sys.executable, "-m", "flows.train", f"algo.lr={lr}", f"train.updates={updates}",
                    f"train.out_dir={out}", f"mlflow.tracking_uri={uri}"], cwd=tmp, env=env, check=True)
    return json.loads((out / "mlflow_run.json").read_text())["run_id"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--updates", type=int, default=8)
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "img")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    tmp = Path(tempfile.mkdtemp(prefix="mlflow-compare-"))
    uri = f"sqlite:///{tmp / 'mlruns.db'}"
    ids = [train(tmp, uri, lr, args.updates) for lr in ("3e-3", "1e-3")]
    port = _free_port()
    server = subprocess.Popen([str(Path(sys.executable).parent / "mlflow"), "server", "--backend-store-uri", uri,
                               "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                              cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import mlflow

        exp = mlflow.tracking.MlflowClient(uri).get_experiment_by_name("swarmpool").experiment_id
        base = f"http://127.0.0.1:{port}"
        exe = shutil.which("chromium") or shutil.which("chromium-browser")
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=exe, headless=True, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            deadline = time.monotonic() + 120
            while True:
                try:
                    page.goto(f"{base}/#/experiments/{exp}", wait_until="load")  # the UI polls: never idle
                    break
                except Exception:  # noqa: BLE001 - the server is still starting
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(1)
            page.wait_for_timeout(8000)
            args.out.mkdir(parents=True, exist_ok=True)
            page.goto(f"{base}/#/compare-runs?runs={json.dumps(ids)}&experiments={json.dumps([exp])}",
                      wait_until="load")
            page.wait_for_timeout(8000)
            page.screenshot(path=str(args.out / "mlflow-compare.png"), full_page=False)
            browser.close()
        print(f"saved {args.out / 'mlflow-compare.png'} (runs {ids})")
    finally:
        server.terminate()
        server.wait(20)


if __name__ == "__main__":
    main()
