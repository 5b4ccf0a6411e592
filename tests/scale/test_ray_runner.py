"""runner=ray: client workers as Ray tasks (prefect-ray RayTaskRunner) on a local loopback-only Ray."""

from __future__ import annotations

import ipaddress
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterName
from prefect.task_runners import ThreadPoolTaskRunner

from flows.config import RayRunner, TaskSection
from flows.workers import RayWorkers, ray_init_kwargs, start_workers
from swarm.policy.echo import EchoBackend
from swarm.pool import Pool, StepFilter
from swarm.stack import start_stack

pytest.importorskip("prefect_ray")
import ray  # noqa: E402
import ray.cloudpickle  # noqa: E402

# pytest imports this file under a name Ray workers cannot import: ship its code by value
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = pytest.mark.usefixtures("prefect_harness")

TASK = TaskSection(name="echo", group_size=2, temperature=1.0, max_tokens=8, episode_timeout_s=60)


def _loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip)
    return bool(addr.is_loopback or (getattr(addr, "ipv4_mapped", None) and addr.ipv4_mapped.is_loopback))


def _ray_connections() -> list[tuple[str, str]]:
    """(process, remote address) of every TCP connection held by this process's Ray children."""
    out = []
    for proc in psutil.Process().children(recursive=True):
        try:
            for c in proc.net_connections(kind="inet"):
                if c.raddr:
                    out.append((proc.name(), c.raddr.ip))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def test_ray_function_sends_prefect_events_before_it_returns(monkeypatch: pytest.MonkeyPatch) -> None:
    """The drain hooks a private prefect-ray method: fail here, not in a flaky end-to-end run, if it moves."""
    import inspect

    from prefect.events.worker import EventsWorker
    from prefect_ray import RayTaskRunner

    from flows.ray_runner import DrainingRayTaskRunner

    assert "self._run_prefect_task" in inspect.getsource(RayTaskRunner.submit)  # what Ray runs
    calls: list[str] = []
    monkeypatch.setattr(RayTaskRunner, "_run_prefect_task", staticmethod(lambda *a, **kw: calls.append("task") or "state"))
    monkeypatch.setattr(EventsWorker, "drain_all", classmethod(lambda cls, timeout=None: calls.append(f"drain {timeout}")))
    assert DrainingRayTaskRunner._run_prefect_task(task=None) == "state"
    assert calls[:2] == ["task", "drain 5.0"]


def test_local_ray_kwargs_stay_on_loopback() -> None:
    address, kw = ray_init_kwargs(RayRunner(kind="ray", num_cpus=2), {"PREFECT_API_URL": "http://127.0.0.1:1/api"})
    assert address is None and kw["_node_ip_address"] == "127.0.0.1" and kw["include_dashboard"] is False
    assert kw["runtime_env"]["env_vars"]["PREFECT_API_URL"] == "http://127.0.0.1:1/api" and kw["num_cpus"] == 2
    address, kw = ray_init_kwargs(RayRunner(kind="ray", address="ray://head:10001"), {})
    assert address == "ray://head:10001" and "_node_ip_address" not in kw and "include_dashboard" not in kw


@flow(task_runner=ThreadPoolTaskRunner(max_workers=4), validate_parameters=False)
def ray_flow(gateway: str, pool_url: str, runner: RayRunner) -> dict:
    """Module level with plain parameters: the flow run context travels to every Ray task (pickled)."""
    pool = Pool(pool_url)
    stop = threading.Event()
    [handle] = start_workers(runner, gateway, TASK, seed=7, agree_every=0, stop=stop, procs=[])
    assert isinstance(handle, RayWorkers)
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline:
            eps = pool.query_episodes(StepFilter(episode_status="finished"), limit=1000)
            if len({e.client_id for e in eps}) >= 2 and len(eps) >= 8:
                break
            if ray.wait([f.wrapped_future for f in handle.futures], timeout=0)[0]:
                break  # a worker task ended early: its error is in the results
            time.sleep(0.5)
        connections = _ray_connections()
    finally:
        stop.set()  # the flow's own signal; the handle relays it to the Ray tasks
        handle.wait(120)
        pool.close()
    return {"results": handle.results(), "connections": connections}


def test_ray_tasks_run_client_workers_against_a_real_gateway(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'pool.db'}"
    pool = Pool(url)
    stack = start_stack(pool, EchoBackend())
    runner = RayRunner(kind="ray", workers=2, tasks=2, num_cpus=2, task_cpus=0.25, home=str(tmp_path / "ray_home"))
    try:
        out = ray_flow(stack.url, url, runner)
    finally:
        stack.stop()
    results = out["results"]
    assert len(results) == 2 and all(r["episodes"] > 0 and r["failed"] == 0 for r in results)
    eps = pool.query_episodes(StepFilter(episode_status="finished"), limit=1000)
    clients = {e.client_id for e in eps}
    assert len(clients) == 2 and all(c.startswith("ray-") for c in clients)
    steps = pool.query_steps(StepFilter(), limit=1000, with_tokens=True)
    assert steps and all(s.response_logprobs is not None for s in steps)
    groups = {s.group_id for s in steps}
    assert all(g.startswith("echo-") for g in groups)
    pool.close()

    conns = out["connections"]
    assert conns, "no Ray process connections seen"
    assert all(_loopback(ip) for _, ip in conns), conns  # nothing leaves loopback

    deadline = time.monotonic() + 30  # a task run's final state reaches Prefect's server a moment after its result
    with get_client(sync_client=True) as client:
        while True:
            runs = client.read_task_runs(task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_="client-ray")))
            done = [r for r in runs if r.state and r.state.is_completed()]
            if len(done) >= 2 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    assert len(done) >= 2, [r.state for r in runs]
    assert not ray.is_initialized()  # the runner that started Ray shut it down
