"""Client workers for the training flow, as Prefect tasks: threads in this process
(``runner=thread``), ``python -m swarm.client`` subprocesses (``runner=process``), which can be
killed and restarted at any time without disturbing the gateway or the trainer, or Ray tasks
through prefect-ray's ``RayTaskRunner`` (``runner=ray``, flows/ray_runner.py) on a local loopback-only Ray or on an
existing cluster (``runner.address``).

Ray tasks cannot see the flow's ``threading.Event``: a small Ray actor carries the stop signal,
set as soon as the flow sets ``stop``. Ray tasks report to the flow's Prefect API (the driver's
``PREFECT_API_URL``, or ``runner.prefect_api_url`` for a cluster that must reach another
address), so no worker starts a temporary Prefect server of its own. Nothing here starts a
cluster on other machines.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NONE
from prefect.futures import PrefectFuture

from flows.config import ProcessRunner, RayRunner, Runner, TaskSection, ThreadRunner
from flows.shutdown import end_process
from swarm.client import WorkerConfig, run_worker
from swarm.rewards import RewardSection

__all__ = ["worker_config", "worker_env", "reward_worker", "thread_worker", "process_worker", "process_command", "ray_worker", "RayWorkers",
           "ray_init_kwargs", "start_ray_workers", "start_workers", "WorkerHandle"]


def worker_config(server: str, task: TaskSection, workers: int, seed: int | None,
                  model: str = "default", agree_every: int = 0) -> WorkerConfig:
    """One client worker's settings for ``task`` against the gateway at ``server``."""
    return WorkerConfig(server=server, task=task.name, workers=workers, group_size=task.group_size, model=model,
                        temperature=task.temperature, max_tokens=task.max_tokens,
                        episode_timeout_s=task.episode_timeout_s, eval_every=task.eval_every, seed=seed,
                        agree_every=agree_every, options=dict(task.options), seeded=task.seeded)


@task(name="client-workers", cache_policy=NONE)
def thread_worker(cfg: WorkerConfig, stop: threading.Event) -> dict[str, float]:
    """Run episodes in threads until ``stop`` is set."""
    return run_worker(cfg, stop)


def process_command(cfg: WorkerConfig) -> list[str]:
    cmd = [sys.executable, "-m", "swarm.client", "--server", cfg.server, "--task", cfg.task,
           "--workers", str(cfg.workers), "--group-size", str(cfg.group_size), "--model", cfg.model,
           "--temperature", str(cfg.temperature), "--max-tokens", str(cfg.max_tokens),
           "--episode-timeout", str(cfg.episode_timeout_s), "--eval-every", str(cfg.eval_every),
           "--agree-every", str(cfg.agree_every), "--options", json.dumps(cfg.options), "--parent", str(os.getpid())]
    if cfg.seed is not None:
        cmd += ["--seed", str(cfg.seed)]
    if cfg.seeded:
        cmd.append("--seeded")
    return cmd


def worker_env() -> dict[str, str]:
    """This environment with this process's own import paths (the repository, a task package kept elsewhere)
    first on ``PYTHONPATH``: a worker process imports the task code the flow checked, wherever it was found."""
    own = [p for p in sys.path if p and os.path.isdir(p) and not p.startswith((sys.prefix, sys.base_prefix))]
    paths = dict.fromkeys([*own, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


# a worker process that exits (not stopped by us) this soon after its start, this many times in a row, did not start:
# the run fails with its stderr's tail instead of restarting it until train.batch_timeout_s
FAST_EXIT_S = 30.0
FAST_EXITS = 3


@task(name="client-process", cache_policy=NONE)
def process_worker(cfg: WorkerConfig, stop: threading.Event, procs: list[subprocess.Popen],
                   failed: Callable[[str], None] | None = None) -> int:
    """Keep one worker process running until ``stop``; a killed worker is restarted (hot swap). One that cannot
    start (it exits within ``FAST_EXIT_S`` of its start ``FAST_EXITS`` times in a row) is reported to ``failed``
    and raises, with the tail of its stderr."""
    restarts = quick = 0
    while not stop.is_set():
        # a restart takes a fresh random seed base: the first start's seeds already named groups in the pool
        run = cfg if restarts == 0 else dataclasses.replace(cfg, seed=None)
        with tempfile.TemporaryFile() as err:
            t0 = time.monotonic()
            proc = subprocess.Popen(process_command(run), stdout=subprocess.DEVNULL, stderr=err, env=worker_env())
            procs.append(proc)
            while proc.poll() is None and not stop.is_set():
                stop.wait(0.2)
            if proc.poll() is None:
                end_process(proc, 10)
                continue
            if stop.is_set():
                continue
            restarts += 1
            quick = quick + 1 if time.monotonic() - t0 < FAST_EXIT_S else 0
            if quick >= FAST_EXITS:
                err.seek(max(0, err.seek(0, os.SEEK_END) - 4000))
                tail = err.read().decode("utf-8", "replace").strip()
                msg = (f"the client worker process exited {quick} times in a row within {FAST_EXIT_S:g} s of its start "
                       f"(last exit code {proc.returncode}); the end of its stderr:\n{tail}")
                if failed is not None:
                    failed(msg)
                raise RuntimeError(msg)
    return restarts


@task(name="reward", cache_policy=NONE)
def reward_worker(reward: RewardSection, pool_url: str, server: str, task_name: str, group_size: int,
                  stop: threading.Event) -> object:
    """The task's reward service until ``stop`` (``task.reward.kind``, swarm/rewards); in this process whatever
    the runner, since it reports rewards to the pool with its own authority ($SWARM_POOL_URL wins)."""
    return reward.serve(os.environ.get("SWARM_POOL_URL") or pool_url, server, task_name, group_size, stop)


# -- runner=ray ---------------------------------------------------------------------------------

# Loopback-only, offline Ray (../shared/ENVIRONMENT.md): no usage stats, no cloud-metadata probes.
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


class _StopFlag:
    """A Ray actor: the flow sets it, the worker tasks poll it."""

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


def _watch(flag: Any, stop: threading.Event, every_s: float = 0.5) -> None:
    import ray

    while not stop.is_set():
        try:
            if ray.get(flag.is_set.remote(), timeout=30):
                stop.set()
        except Exception:  # the flag actor (the driver) is gone: nobody will collect our episodes
            stop.set()
        stop.wait(every_s)


@task(name="client-ray", cache_policy=NONE)
def ray_worker(cfg: WorkerConfig, flag: Any) -> dict[str, float]:
    """Run episodes in threads inside a Ray worker until the flow sets the stop flag."""
    stop = threading.Event()
    threading.Thread(target=_watch, args=(flag, stop), name="swarm-ray-stop", daemon=True).start()
    try:
        return run_worker(cfg, stop)
    finally:
        stop.set()


@contextlib.contextmanager
def _scratch_env(env: dict[str, str]) -> Iterator[None]:
    """Set ``env`` while Ray starts its processes (they inherit it), then restore ours."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _ray_home(runner: RayRunner) -> Path:
    """A scratch HOME whose ray_bootstrap_config.yaml says ``provider: local`` (no cloud probing)."""
    home = Path(runner.home or Path.cwd() / ".cache" / "ray_home").resolve()
    home.mkdir(parents=True, exist_ok=True)
    cfg = home / "ray_bootstrap_config.yaml"
    if not cfg.exists():
        cfg.write_text("# written by swarmpool (flows/workers.py): a local provider, so Ray probes no cloud\n"
                       "provider: {type: local}\n")
    return home


def _loopback_only() -> None:
    """Keep a local Ray on 127.0.0.1 even when ``ray`` was imported before RAY_ENV was set.

    Ray reads RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER once, at import; unless it is 0, ``ray.init``
    turns ``_node_ip_address="127.0.0.1"`` into the host's routable address (found with a UDP
    connect to 8.8.8.8) and the node talks to itself over that address. A local single-node
    Ray never needs that, so the flag is cleared here; joining a cluster (``address``) is
    left alone.
    """
    import ray._private.ray_constants as ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False


def ray_init_kwargs(runner: RayRunner, env_vars: dict[str, str]) -> tuple[str | None, dict[str, Any]]:
    """(address, ``ray.init`` kwargs) for ``runner``: a local loopback-only Ray when ``address`` is null."""
    address = runner.address or None
    kw: dict[str, Any] = {"namespace": runner.namespace, "log_to_driver": False,
                          "runtime_env": {"env_vars": dict(env_vars)}}
    if address is None:
        kw.update(include_dashboard=False, _node_ip_address=runner.node_ip)
        if runner.num_cpus is not None:
            kw["num_cpus"] = runner.num_cpus
    return address, kw


def _prefect_api_url(runner: RayRunner) -> str | None:
    """Where Ray tasks report their task runs: the flow's own Prefect API unless configured."""
    if runner.prefect_api_url:
        return runner.prefect_api_url
    from prefect.context import FlowRunContext
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return str(PREFECT_API_URL.value())
    ctx = FlowRunContext.get()
    client = getattr(ctx, "client", None)
    return str(client.api_url).rstrip("/") if client is not None else None  # the driver's temporary server


class RayWorkers:
    """The flow's handle on its Ray worker tasks: ``wait`` stops them and shuts the runner down."""

    def __init__(self, runner: Any, flag: Any, futures: list[Any], stop: threading.Event) -> None:
        self.runner, self.flag, self.futures, self._stop = runner, flag, futures, stop
        self._closed = False
        self._lock = threading.Lock()
        threading.Thread(target=self._relay, name="swarm-ray-relay", daemon=True).start()

    def _relay(self) -> None:
        self._stop.wait()
        self._signal()

    def _signal(self) -> None:
        import ray

        # never call into Ray once the runner is closed: a Ray API call would auto-start a new,
        # default (not loopback-only) Ray instance
        with self._lock:
            if self._closed or not ray.is_initialized():
                return
            with contextlib.suppress(Exception):  # the flag actor is gone already
                ray.get(self.flag.set.remote(), timeout=30)

    def wait(self, timeout: float | None = None) -> None:
        """Set the stop flag, wait up to ``timeout`` s for the tasks, then leave the runner (once)."""
        self._signal()
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            if self._closed:
                return
            for f in self.futures:
                f.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
            self._closed = True
            self.runner.__exit__(None, None, None)

    def results(self) -> list[dict[str, float]]:
        """Each task's ``run_worker`` stats, after :meth:`wait` (raises a task's error)."""
        out = []
        for f in self.futures:
            if getattr(f, "_final_state", None) is None:
                raise RuntimeError(f"Ray worker task {f.task_run_id} did not finish before its runner closed")
            out.append(f.result())
        return out


def start_ray_workers(runner: RayRunner, server: str, task_cfg: TaskSection, seed: int | None,
                      agree_every: int, stop: threading.Event) -> RayWorkers:
    """Start ``runner.tasks`` Ray tasks, each running ``runner.workers`` concurrent episodes."""
    import ray
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect_ray.context import remote_options

    from flows.ray_runner import DrainingRayTaskRunner

    api = _prefect_api_url(runner)
    env = {**RAY_ENV, **{k: v for k, v in os.environ.items() if k.startswith(("PREFECT_", "SWARM_", "HF_"))}}
    env.pop("SWARM_POOL_URL", None)  # workers talk to the gateway only
    if api:
        env["PREFECT_API_URL"] = api
    address, init_kw = ray_init_kwargs(runner, env)
    ray_runner = DrainingRayTaskRunner(address=address, init_kwargs=init_kw)
    scratch = {**RAY_ENV, "HOME": str(_ray_home(runner))} if address is None else dict(RAY_ENV)
    if address is None:
        _loopback_only()
    with _scratch_env(scratch):
        ray_runner.__enter__()
    try:
        flag = ray.remote(num_cpus=0)(_StopFlag).remote()
        futures = []
        updates = {PREFECT_API_URL: api} if api else {}
        with temporary_settings(updates=updates), remote_options(num_cpus=runner.task_cpus):
            for i in range(runner.tasks):
                base = None if seed is None else (seed * 1_000 + i) * 1_000_000  # disjoint seed streams per task
                cfg = worker_config(runner.server or server, task_cfg, runner.workers, base,
                                    agree_every=agree_every)
                cfg.client_id = f"ray-{i}-{random.randrange(1 << 30):x}"
                futures.append(ray_runner.submit(ray_worker, {"cfg": cfg, "flag": flag}))
    except BaseException:
        ray_runner.__exit__(None, None, None)
        raise
    return RayWorkers(ray_runner, flag, futures, stop)


WorkerHandle = PrefectFuture[Any] | RayWorkers  # what start_workers returns; each has .wait(timeout)


def start_workers(runner: Runner, server: str, task_cfg: TaskSection, seed: int, agree_every: int,
                  stop: threading.Event, procs: list[subprocess.Popen], configs: list[WorkerConfig] | None = None,
                  pool_url: str | None = None, failed: Callable[[str], None] | None = None) -> list[WorkerHandle]:
    """Submit the client workers the ``runner`` config group asks for, and the reward service of
    ``task.reward`` (on the pool at ``pool_url``) when it has one; returns their Prefect futures. ``configs``
    receives the thread and process workers' WorkerConfigs (run control changes their ``eval_every``); ``failed``
    hears of worker processes that cannot start (:func:`process_worker`)."""
    clients = _client_workers(runner, server, task_cfg, seed, agree_every, stop, procs, configs, failed)
    if task_cfg.reward is not None:
        clients.append(reward_worker.submit(task_cfg.reward, str(pool_url), server, task_cfg.name,
                                            task_cfg.group_size, stop))
    return clients


def _client_workers(runner: Runner, server: str, task_cfg: TaskSection, seed: int, agree_every: int,
                    stop: threading.Event, procs: list[subprocess.Popen], configs: list[WorkerConfig] | None,
                    failed: Callable[[str], None] | None = None) -> list[WorkerHandle]:
    configs = configs if configs is not None else []
    if isinstance(runner, ProcessRunner):
        # process k claims groups from seed * 1e6 + k * 1e5 on (the thread runner's stream is seed * 1e6): a
        # run's prompts follow its seed, as with threads
        made = [worker_config(server, task_cfg, runner.workers, seed * 1_000_000 + k * 100_000, agree_every=agree_every)
                for k in range(runner.processes)]
        configs += made
        return [process_worker.submit(wc, stop, procs, failed) for wc in made]
    if isinstance(runner, ThreadRunner):
        wc = worker_config(server, task_cfg, runner.workers, seed * 1_000_000, agree_every=agree_every)
        configs.append(wc)
        return [thread_worker.submit(wc, stop)]
    return [start_ray_workers(runner, server, task_cfg, seed, agree_every, stop)]
