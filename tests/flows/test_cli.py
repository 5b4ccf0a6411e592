"""``python -m flows.train`` with bad input: one line naming the key, exit 2, before the heavy imports."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from flows.config import ConfigError, check_pool_url, validate
from flows.tracking import run_name, run_params, run_tags

REPO = Path(__file__).resolve().parents[2]
# run main() and report which heavy modules were imported by the time it exited
_PROBE = """
import sys
from flows.train import main
try:
    main()
finally:
    heavy = sorted(m for m in ("torch", "prefect", "mlflow", "transformers") if m in sys.modules)
    print("HEAVY", heavy, file=sys.stderr)
"""


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("SWARM_POOL_URL", None)
    return subprocess.run([sys.executable, "-c", _PROBE, *args, f"train.out_dir={tmp_path / 'run'}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("args", "needle"), [
    (["train.updates=-1"], "train.updates=-1: Input should be greater than or equal to 1"),
    (["task.group_size=0"], "task.group_size=0"),
    (["task.group_size=1"], "GRPO compares the episodes of a group"),
    (["train.updatez=3"], "train.updatez: no such config key (did you mean train.updates?)"),
    (["batching.strategy=nope"], "batching.strategy=nope"),
    (["runner.workers=0"], "runner.workers=0"),
    (["pool.url=postgresql+psycopg://nobody@127.0.0.1:9/x"], "cannot connect"),
    (["pool.url=foo://x"], "unsupported database 'foo'"),
    (["+task=werewolves", "task.options.vote_shaping=0.9"], "task.options.vote_shaping=0.9: Input should be less than or equal to 0.5"),
    (["+task=werewolves", "+task.options.colour=red"], "task.options.colour: unknown key"),
    (["+task=cocktail", "+task.options.mix={nosuch:1}"], "task.options.mix: task 'nosuch': no module"),
    (["task.name=no_such_task"], "task.name='no_such_task': task 'no_such_task': no module"),
    (["+task=werewolves", "algo.lr=-1"], "algo.lr: must be > 0"),
    (["algo.merge=zip"], "algo.merge: must be one of"),
    (["algo.lora.rank=0"], "algo.lora.rank: must be >= 1"),
    (["+algo.lora.rnak=4"], "algo.lora.rnak: unknown key (did you mean algo.lora.rank?)"),
    (["model=echo", "+model.dely_s=1"], "model.dely_s: unknown key (did you mean model.delay_s?)"),
    (["model=smollm2", "model.gguf=/no/such.gguf"], "model.gguf=/no/such.gguf: no GGUF file at /no/such.gguf"),
])
def test_bad_values_fail_fast_with_one_line(tmp_path: Path, args: list[str], needle: str) -> None:
    proc = _cli(tmp_path, *args)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if not ln.startswith("HEAVY")]
    assert len(lines) == 1 and lines[0].startswith("config error: ") and needle in lines[0], proc.stderr
    assert "HEAVY []" in proc.stderr  # no Prefect, MLflow or torch import was paid for the error
    assert [p.name for p in tmp_path.iterdir()] in ([], ["run"])  # at most Hydra's record of the attempt


def _cfg(**over: object) -> dict:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = compose(config_name="train", overrides=["train.out_dir=/tmp/x", *[f"{k}={v}" for k, v in over.items()]])
    out = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(out, dict)
    return out


def test_run_config_is_typed_and_names_runs_by_what_differs() -> None:
    run = validate(_cfg(), overrides=["algo.lr=1e-3", "seed=1", "train.out_dir=/tmp/x", "gateway.port=5"])
    assert run.train.updates == 100 and run.task.group_size == 8 and run.batching.strategy == "groups"
    assert run_name(run) == "echo lr=1e-3 seed=1"
    params = run_params(run)
    assert "algo.lr" in params and "train.updates" in params
    assert not any(k.startswith(("train.out_dir", "pool.url", "gateway.port", "mlflow.tracking_uri")) for k in params)
    tags = run_tags(run.model_copy(update={"mlflow": run.mlflow.model_copy(update={"tags": {"swarm.campaign": "c"}})}))
    assert tags["swarm.task"] == "echo" and tags["swarm.campaign"] == "c" and tags["swarm.model"]


def test_unknown_section_keys_are_named() -> None:
    raw = _cfg()
    raw["train"]["updatez"] = 3
    with pytest.raises(ConfigError, match=r"train.updatez: unknown key \(did you mean train.updates\?\)"):
        validate(raw)


@pytest.mark.parametrize(("typo", "needle"), [
    ("+model.devise=cpu", "model.devise: unknown key (did you mean model.device?)"),
    ("+algo.scale_sdt=false", "algo.scale_sdt: unknown key (did you mean algo.scale_std?)"),
    ("+algo.lora.rnak=4", "algo.lora.rnak: unknown key (did you mean algo.lora.rank?)"),
    ("+pool.blok_size=8", "pool.blok_size: unknown key (did you mean pool.block_size?)"),
    ("+runner.worker=2", "runner.worker: unknown key (did you mean runner.workers?)"),
    ("+gateway.log_levl=info", "gateway.log_levl: unknown key (did you mean gateway.log_level?)"),
    ("+train.updatez=3", "train.updatez: unknown key (did you mean train.updates?)"),
    ("+batching.min_group=2", "batching.min_group: unknown key (did you mean batching.min_groups?)"),
    ("+mlflow.experimnt=x", "mlflow.experimnt: unknown key (did you mean mlflow.experiment?)"),
    ("+task.group_sise=2", "task.group_sise: unknown key (did you mean task.group_size?)"),
    ("+frozen_policies.judge.backend=echo", None),  # a valid frozen echo model: no error
    ("+frozen_policies.judge.backend=ech", "frozen_policies.judge.backend=ech: unknown; use one of echo, fleet, hf, upstream, vllm"),
])
def test_a_mistyped_key_in_any_group_is_named_with_the_close_one(typo: str, needle: str | None) -> None:
    """Every group is a section that forbids unknown keys: ``scale_sdt`` or ``lora.rnak`` is no longer dropped."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        raw = OmegaConf.to_container(compose(config_name="train", overrides=["train.out_dir=/tmp/x", typo]), resolve=True)
    if needle is None:
        validate(raw)
        return
    with pytest.raises(ConfigError) as exc:
        validate(raw)
    assert str(exc.value).startswith(needle), str(exc.value)


def test_make_train_config_refuses_what_it_used_to_drop() -> None:
    """The issue's example: ``scale_sdt`` and ``lora.rnak`` were accepted silently; now each is named."""
    from flows.config import AlgoSection

    for bad, key in (({"scale_sdt": False}, "scale_sdt"), ({"lora": {"rank": 8, "rnak": 4}}, "rnak")):
        with pytest.raises(ValueError, match=key):
            AlgoSection(**bad)
    assert AlgoSection(lr=1e-3).train_config(0.7, 3).temperature == 0.7


def test_sqlite_pool_folder_must_be_creatable(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="cannot create"):
        check_pool_url(f"sqlite:///{tmp_path / 'file' / 'sub' / 'pool.db'}")
    check_pool_url(f"sqlite:///{tmp_path / 'ok' / 'pool.db'}")


def test_task_options_are_checked_by_the_package_or_configure() -> None:
    """Every task's ``Options`` (swarm.client.TaskOptions) checks task.options: one line naming the key."""
    from flows.config import TaskSection, check_task

    def task(name: str, **options: object) -> TaskSection:
        return TaskSection(name=name, group_size=2, temperature=1.0, max_tokens=4, episode_timeout_s=1, options=options)

    check_task(task("werewolves", vote_shaping=0.5))
    check_task(task("cocktail", mix={"echo": 1}))
    check_task(task("echo"))
    with pytest.raises(ConfigError, match=r"task.options.llm_decisions=\['dance'\]: use a non-empty subset"):
        check_task(task("werewolves", llm_decisions=["dance"]))
    with pytest.raises(ConfigError, match=r"^task.options.vote_shaping=None: Input should be a valid number"):
        check_task(task("werewolves", vote_shaping=None))
    with pytest.raises(ConfigError, match=r"task.options.mix=.*weight of 'echo' must be a number >= 0"):
        check_task(task("cocktail", mix={"echo": -1}))
    with pytest.raises(ConfigError, match=r"^task.options.weights: unknown key"):
        check_task(task("cocktail", weights={"echo": 1}))
    with pytest.raises(ConfigError, match=r"^task.options.typo: unknown key"):
        check_task(task("math", typo=1))
    # workers on other machines may hold a package this process cannot import: not refused here
    from flows.config import ProcessRunner, RayRunner

    check_task(task("only_on_the_clients"), ProcessRunner(kind="process", processes=0))
    check_task(task("only_on_the_clients"), RayRunner(kind="ray", address="auto"))
    with pytest.raises(ConfigError, match="no module"):
        check_task(task("only_on_the_clients"), ProcessRunner(kind="process", processes=2))
