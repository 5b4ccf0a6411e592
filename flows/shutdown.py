"""Clean stops for ``python -m flows.train``: Ctrl-C / SIGTERM finish the current update and exit.

- :class:`StopSignal`: SIGINT and SIGTERM set a :class:`threading.Event` instead of raising in
  the middle of a Prefect call; the flow checks it between stages, its session checkpoints,
  settles, ends the MLflow run KILLED, and ``main`` exits with ``128 + signal`` (130 / 143)
  without a traceback. A second signal exits at once (same code).
- :func:`own_prefect_server`: Prefect's temporary server, a child in our process group, would
  die of the terminal's Ctrl-C (every later Prefect call retrying ~75 s); unless ``PREFECT_API_URL``
  is set we start that server under uvicorn in its own session, stop it last, and have the kernel
  stop it if we die (``PR_SET_PDEATHSIG``).

Does not know what a flow does; ``flows/train.py`` and ``flows/session.py`` wire them.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["StopSignal", "STOP", "own_prefect_server", "end_process"]


class StopSignal:
    """SIGINT / SIGTERM -> ``event`` (first signal), immediate exit (second signal)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def install(self) -> threading.Event:
        """Handle SIGINT and SIGTERM in this process (main thread only; elsewhere a no-op); returns the
        event to watch: a fresh one unless a signal arrived (a run sets its event when it ends)."""
        if self.signum is None and self.event.is_set():
            self.event = threading.Event()
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                old = signal.signal(sig, self._handle)
                if old is not self._handle:
                    self._previous.setdefault(sig, old)
        return self.event

    def restore(self) -> None:
        """Put back the handlers that were there before :meth:`install` (e.g. pytest's)."""
        if threading.current_thread() is threading.main_thread():
            for sig, old in self._previous.items():
                signal.signal(sig, old)
        self._previous = {}

    def _handle(self, signum: int, frame: object) -> None:
        if self.signum is not None:
            os._exit(128 + signum)  # asked twice: stop now, no cleanup (the checkpoint is atomic)
        self.signum = signum
        self.event.set()
        # the flow checks the event between stages: a model build under way (minutes for the tiny model's
        # warm-up, then cached) or an update finishes first
        print(f"\n{signal.Signals(signum).name}: finishing what is under way (the current update, or the model "
              "build), then checkpoint and stop (send it again to stop at once)", file=sys.stderr, flush=True)

    @property
    def exit_code(self) -> int | None:
        """``128 + signal`` once a signal arrived, else None."""
        return None if self.signum is None else 128 + self.signum


STOP = StopSignal()

_CHILD = """
import ctypes, os, runpy, signal, sys
parent = int(sys.argv.pop(1))
try:  # the kernel sends SIGTERM when the process that started us dies (Linux)
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
except (OSError, AttributeError):
    pass
if os.getppid() != parent:
    sys.exit(0)
sys.argv[0] = "uvicorn"
runpy.run_module("uvicorn", run_name="__main__", alter_sys=True)
"""


@contextlib.contextmanager
def own_prefect_server(timeout_s: float | None = None) -> Iterator[str | None]:
    """Run the flows under a Prefect server in its own session (yields its API URL; None: one is set)."""
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, temporary_settings

    if PREFECT_API_URL.value():
        yield None
        return
    import httpx
    import prefect

    from swarm.stack import free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
    cmd = [sys.executable, "-c", _CHILD, str(os.getpid()), "--app-dir", str(Path(prefect.__file__).parent.parent),
           "--factory", "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(port),
           "--log-level", "error", "--lifespan", "on"]
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdin=subprocess.DEVNULL)

    def stop() -> None:
        end_process(proc, 10)

    atexit.register(stop)  # registered before Prefect's own exit hooks, so it runs after them
    deadline = time.monotonic() + float(timeout_s or PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value())
    with httpx.Client(timeout=5) as http:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the Prefect server exited with code {proc.returncode} while starting")
            try:
                if http.get(url + "/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                stop()
                raise RuntimeError(f"the Prefect server on {url} did not start in time "
                                   "(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS)")
            time.sleep(0.2)
    with temporary_settings(updates={PREFECT_API_URL: url}):
        yield url  # the server is stopped at exit, after Prefect has flushed its logs and events to it


def end_process(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM ``proc`` if it still runs; SIGKILL it after ``grace_s`` seconds; reap it either way."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
