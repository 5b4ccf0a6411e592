"""flows.eval (eval anytime, pinned): config errors, a version without an adapter, same seeds -> same instances, and version 1 evaluated while version 3 trains."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from flow_waits import wait_for
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from safetensors.torch import save_file

from flows.config import ConfigError, EvalConfig, validate
from flows.eval import resolve_target, run_eval
from swarm.pool import Pool, StepFilter
from swarm.records import PolicyVersion
from swarm.stack import free_port

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"


def _eval_config(*overrides: str) -> EvalConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose(config_name="eval", overrides=list(overrides))
    out = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(out, dict)
    return validate(out, schema=EvalConfig)


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "flows.eval", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("args,message", [
    (["eval.vesion=1"], "config error: eval.vesion: no such config key (did you mean eval.version?)"),
    (["+eval.bogus=1", "eval.version=1"], "config error: eval.bogus: unknown key"),
    ([], "config error: eval: set one of eval.version=N"),
    (["eval.version=1", "eval.checkpoint=/tmp"], "not both"),
    (["eval.version=1", "eval.groups=0"], "config error: eval.groups=0: Input should be greater than or equal to 1"),
    (["eval.version=1", "pool.url=mysql://x/y"], "config error: pool.url=mysql://x/y: unsupported database"),
    (["eval.version=1", "task.name=no_such_task"], "config error: task.name='no_such_task'"),
])
def test_config_errors_name_the_key(args: list[str], message: str, tmp_path: Path) -> None:
    pool = [] if any(a.startswith("pool.url=") for a in args) else [f"pool.url=sqlite:///{tmp_path}/pool.db"]
    done = _cli(*args, *pool)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_every_task_file_composes_with_the_eval_config() -> None:
    for task in sorted(p.stem for p in (CONF / "task").glob("*.yaml")):
        c = _eval_config(f"+task={task}", "eval.version=1")
        assert c.task.name and c.eval.version == 1, task


def _adapter(root: Path, version: int) -> Path:
    """A saved adapter folder as the trainer writes it (only its files: the echo backend ignores the weights)."""
    d = root / "adapters" / "default" / f"v{version:06d}"
    d.mkdir(parents=True)
    save_file({"w": torch.zeros(2)}, str(d / "adapter_model.safetensors"))
    (d / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]}))
    (d / "swarm_version.json").write_text(json.dumps({"policy": "default", "version": version}))
    return d


def test_a_version_without_an_adapter_is_a_clear_error(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/pool.db"
    pool = Pool(url)
    try:
        pool.add_policy_version(PolicyVersion(policy="default", version=1, adapter_path=None))
        pool.add_policy_version(PolicyVersion(policy="default", version=2, adapter_path=str(_adapter(tmp_path, 2))))
        with pytest.raises(ConfigError, match=r"eval.version=1: version 1 of 'default' kept no adapter\. Checkpoints "
                                              r"keep adapters: train.checkpoint_every=k .* with an adapter: \[2\]"):
            resolve_target(pool, _eval_config("eval.version=1").eval)
        with pytest.raises(ConfigError, match=r"eval.version=5: policy 'default' has no published version 5"):
            resolve_target(pool, _eval_config("eval.version=5").eval)
        assert resolve_target(pool, _eval_config("eval.version=2").eval).version == 2
    finally:
        pool.close()
    done = _cli("eval.version=1", f"pool.url={url}", "model=echo")
    assert done.returncode == 2 and "kept no adapter" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_checkpoint_folder_resolves_to_the_adapter_its_commit_wrote(tmp_path: Path) -> None:
    from swarm.train.checkpoint import commit_checkpoint

    adapter = _adapter(tmp_path, 3)
    ckpt = commit_checkpoint(tmp_path / "checkpoints" / "default", 7, {"policy": "default", "version": 3})
    for folder in (adapter, ckpt, ckpt.parent):
        t = resolve_target(None, _eval_config(f"eval.checkpoint={folder}").eval)
        assert (t.policy, t.version, t.weights) == ("default", 3, adapter), folder
    with pytest.raises(ConfigError, match=r"eval.checkpoint=.*: it holds policy 'default'; set eval.policy=default"):
        resolve_target(None, _eval_config(f"eval.checkpoint={adapter}", "eval.policy=other").eval)
    with pytest.raises(ConfigError, match=r"eval.checkpoint=.*: not an adapter folder"):
        resolve_target(None, _eval_config(f"eval.checkpoint={tmp_path}").eval)


def test_same_version_same_seed_same_instances(tmp_path: Path) -> None:
    """Two evaluations of version 1 through real gateways on one pool: the same seeds, instances and rewards."""
    url = f"sqlite:///{tmp_path}/pool.db"
    pool = Pool(url)
    adapter = _adapter(tmp_path, 1)
    pool.add_policy_version(PolicyVersion(policy="default", version=1, adapter_path=str(adapter)))
    base = ["model=echo", f"pool.url={url}", "eval.groups=2", "eval.group_size=3", "eval.seed=123",
            f"mlflow.tracking_uri=sqlite:///{tmp_path}/mlruns.db"]
    try:
        first = run_eval(_eval_config(*base, "eval.version=1"))
        second = run_eval(_eval_config(*base, f"eval.checkpoint={adapter}"))  # the same weights by folder
        seen = []
        for out in (first, second):
            (r,) = out.results
            assert (r.policy, r.version, r.source, r.episodes) == ("default", 1, "pinned", 6)
            eps = pool.query_episodes(StepFilter(metadata={"eval_run": out.eval_run}), limit=100)
            assert {e.type for e in eps} == {"eval"} and len(eps) == 6
            assert all(e.metadata["eval_of"] == {"policy": "default", "version": 1} for e in eps)
            assert r.reward == pytest.approx(sum(e.reward for e in eps) / 6)
            steps = pool.query_steps(StepFilter(metadata={"eval_run": out.eval_run}), limit=100)
            assert steps and {s.policy_version for s in steps} == {1}
            seen.append((sorted((e.group_id, e.metadata["seed"]) for e in eps),
                         sorted((s.group_id, s.prompt_messages[-1]["content"], s.response_text)
                                for s in steps if s.prompt_messages), r.reward))
        assert seen[0] == seen[1]
        assert {s for _, s in seen[0][0]} == {123, 124}
        assert [r.version for r in pool.eval_results(policy="default")] == [1, 1]
    finally:
        pool.close()


# -- during a training run ----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_harness")
def test_version_1_evaluated_while_version_3_trains(flow_config, tmp_path: Path) -> None:
    from flows.train import train_flow

    updates = 5
    cfg = flow_config("task.group_size=4", "batching.min_groups=2", "runner.workers=4", "train.checkpoint_every=1",
                      f"train.updates={updates}", "train.batch_timeout_s=120", f"gateway.port={free_port()}")
    url, mlruns = cfg["pool"]["url"], cfg["mlflow"]["tracking_uri"]
    result: dict[str, Any] = {}
    flow = threading.Thread(target=lambda: result.update(train_flow(cfg)), daemon=True)
    flow.start()
    pool = None
    try:
        wait_for(lambda: Path(url.removeprefix("sqlite:///")).exists(), 120, "the pool", flow)
        pool = Pool(url)
        wait_for(lambda: pool.latest_version("default") >= 2, 300, "version 2", flow)
        started = time.time()
        done = _cli("eval.version=1", f"pool.url={url}", f"mlflow.tracking_uri={mlruns}", "eval.groups=2",
                    "eval.group_size=4", "task.max_tokens=8", timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "eval default v1 on echo: 8 episodes" in done.stdout, done.stdout
        flow.join(400)
        assert not flow.is_alive(), "the run did not finish"
        assert result["status"] == "FINISHED" and result["updates"] == updates, result

        (r,) = pool.eval_results(policy="default", version=1)
        print(done.stdout.strip().splitlines()[-1])
        eps = pool.query_episodes(StepFilter(metadata={"eval_run": r.metadata["eval_run"]}), limit=100)
        assert r.source == "pinned" and r.episodes == len(eps) == 8 and {e.type for e in eps} == {"eval"}
        assert r.reward == pytest.approx(sum(e.reward for e in eps) / len(eps))
        assert {e.metadata["seed"] for e in eps} == {10**15, 10**15 + 1}
        steps = pool.query_steps(StepFilter(metadata={"eval_run": r.metadata["eval_run"]}), limit=1000)
        assert len(steps) == 8 and {s.policy_version for s in steps} == {1}
        v3 = next(v for v in pool.policy_versions("default") if v.version == 3)
        assert v3.created_at > started, "version 3 was published before the evaluation started"
        # again, after the run: the hf backend is seeded per call, so the same instances get the same replies
        again = run_eval(_eval_config("eval.version=1", f"pool.url={url}", f"mlflow.tracking_uri={mlruns}",
                                      "eval.groups=2", "eval.group_size=4", "task.max_tokens=8"))
        replies = [sorted((s.group_id, s.response_text) for s in pool.query_steps(
            StepFilter(metadata={"eval_run": run}), limit=1000)) for run in (r.metadata["eval_run"], again.eval_run)]
        assert replies[0] == replies[1] and again.results[0].reward == r.reward
    finally:
        if pool is not None:
            pool.close()
    with sqlite3.connect(url.removeprefix("sqlite:///")) as db:
        q = "SELECT count(*) FROM steps s JOIN episodes e ON s.episode_id = e.episode_id WHERE "
        assert db.execute(q + "e.type = 'eval' AND (s.lease_id IS NOT NULL OR s.consumed_version IS NOT NULL)"
                          ).fetchone() == (0,)  # never leased, never trained
        assert db.execute(q + "s.consumed_version IS NOT NULL AND e.type != 'train'").fetchone() == (0,)
        assert db.execute(q + "s.consumed_version IS NOT NULL").fetchone()[0] >= updates * 2 * 4

    import mlflow

    mlflow.set_tracking_uri(mlruns)
    (train_run,) = mlflow.search_runs(experiment_names=["swarmpool"], output_format="list",
                                      filter_string="attributes.run_name != 'eval default v1'")
    assert not [k for k in train_run.data.metrics if k.startswith("eval/")]  # the pinned episodes are not the run's
    run, _ = mlflow.search_runs(experiment_names=["swarmpool"], filter_string="attributes.run_name = 'eval default v1'",
                                output_format="list", order_by=["attributes.start_time ASC"])
    hist = mlflow.tracking.MlflowClient().get_metric_history(run.info.run_id, "eval/reward")
    assert [(m.step, m.value) for m in hist] == [(1, pytest.approx(r.reward))]
    assert r.metadata["mlflow_run_id"] == run.info.run_id
    # the version's record names the run that trained it, and the eval says so
    assert r.metadata["training_run_id"] == train_run.info.run_id
    assert run.data.tags["swarm.training_run_id"] == train_run.info.run_id


def test_sigterm_ends_everything_and_records_nothing(tmp_path: Path) -> None:
    import signal

    import httpx

    url = f"sqlite:///{tmp_path}/pool.db"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "flows.eval", "model=echo", "model.delay_s=0.3", "eval.version=0",
                             f"pool.url={url}", "eval.groups=50", f"mlflow.tracking_uri=sqlite:///{tmp_path}/m.db"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        line = ""
        while " through http" not in line:
            line = proc.stdout.readline()
            assert line, "flows.eval ended before its gateway started"
        gateway = line.rsplit(" ", 1)[1].strip()
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=30)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, rest
    assert "eval stopped: nothing recorded" in rest and "Traceback" not in rest, rest
    with pytest.raises(httpx.HTTPError):
        httpx.get(gateway + "/health", timeout=2)
    pool = Pool(url)
    try:
        assert pool.eval_results() == []
    finally:
        pool.close()


def test_the_mean_reward_is_the_same_in_any_order_the_episodes_end() -> None:
    """Concurrent episodes end in any order: their mean is exactly rounded, not summed in that order."""
    from flows.eval import _mean

    xs, ys = [0.1, 0.7, 1 / 3, 0.2, 0.9, 2 / 7], [0.2, 2 / 7, 1 / 3, 0.9, 0.7, 0.1]  # the same six, reordered
    assert sum(xs) / 6 != sum(ys) / 6  # a plain sum's last bit depends on the order
    assert _mean(xs) == _mean(ys) == _mean(sorted(xs))
