"""A worker process started with ``--parent`` stops once that process is gone (a SIGKILLed flow leaves no worker)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil


def test_a_worker_stops_when_its_parent_is_killed() -> None:
    # a middle process starts the worker with itself as --parent, prints the worker's pid, then sleeps
    middle = subprocess.Popen(
        [sys.executable, "-c",
         "import os, subprocess, sys, time\n"
         "w = subprocess.Popen([sys.executable, '-m', 'swarm.client', '--server', 'http://127.0.0.1:9',\n"
         "                      '--task', 'echo', '--workers', '1', '--parent', str(os.getpid())],\n"
         "                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
         "print(w.pid, flush=True)\n"
         "time.sleep(600)\n"],
        stdout=subprocess.PIPE, text=True)
    try:
        worker = psutil.Process(int(middle.stdout.readline()))
        time.sleep(1.0)  # the worker is up (and failing to reach the closed port, as it would a dead gateway)
        assert worker.is_running()
        os.kill(middle.pid, signal.SIGKILL)
        middle.wait()
        worker.wait(timeout=20)  # gone on its own: nothing else stops it
    finally:
        middle.kill()
        for p in psutil.process_iter(["cmdline"]):
            if "--parent" in (p.info["cmdline"] or []) and str(middle.pid) in p.info["cmdline"]:
                p.kill()
