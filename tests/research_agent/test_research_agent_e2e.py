"""Plain English -> validated task -> one training update: the CLI with a scripted fake LLM whose
first package has a real bug (the repair loop runs), then the generated task through flows.train."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlflow
import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from ra_scripted import game24_script

from research_agent.__main__ import main

REPO = Path(__file__).resolve().parents[2]
DESCRIPTION = ("Train the policy to play 24: given four numbers, answer an expression that equals 24; "
               "reward 1 if valid and correct, 0.2 if valid but wrong")


@pytest.mark.slow
def test_description_to_trained_task(tmp_path: Path, fake_llm, prefect_harness, monkeypatch, capsys) -> None:
    llm = fake_llm(game24_script)
    conf = tmp_path / "conf"
    shutil.copytree(REPO / "conf", conf)
    out = tmp_path / "gentasks"
    rc = main([DESCRIPTION, "--out", str(out), "--conf-dir", str(conf), "--max-attempts", "3",
               "--base-url", llm.url, "--api-key", "test-key", "--model", "fake-coder"])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    pkg = out / "game24"
    # stages saved under the task folder
    assert (pkg / "spec.yaml").exists() and yaml.safe_load((pkg / "spec.yaml").read_text())["description"] == DESCRIPTION
    first = json.loads((pkg / "research" / "attempt-1" / "validation.json").read_text())
    failed = {c["name"]: c["detail"] for c in first["checks"] if not c["ok"]}
    assert "SyntaxError" in failed["property: malformed answers score in range, deterministically"]
    second = (pkg / "research" / "attempt-2" / "validation.md").read_text()
    assert second.startswith("# Validation: PASSED") and "episodes finished" in second
    assert not (pkg / "research" / "attempt-3").exists()
    # the repair request carried the traceback back to the LLM
    assert [m[0]["content"].split("\n")[0][:12] for m in llm.requests] == ["You design r", "You write Py", "You fix Pyth"]
    assert "SyntaxError" in llm.requests[2][1]["content"]
    assert len((pkg / "research" / "transcript.jsonl").read_text().splitlines()) == 3
    assert "+task=game24" in printed
    task_yaml = (conf / "task" / "game24.yaml").read_text()
    assert task_yaml.startswith("# @package _global_") and "name: gentasks.game24" in task_yaml

    # hand over: one real update through the training flow with +task=game24
    from flows.train import train_flow

    monkeypatch.syspath_prepend(str(tmp_path))
    with initialize_config_dir(config_dir=str(conf), version_base=None):
        cfg = compose(config_name="train", overrides=[
            "+task=game24", f"train.out_dir={tmp_path / 'run'}", f"mlflow.tracking_uri=sqlite:///{tmp_path / 'ml.db'}",
            "train.updates=1", "batching.min_groups=1", "mlflow.sample_trajectories=1", "runner.workers=4"])
    resolved = OmegaConf.to_container(cfg, resolve=True)
    summary = train_flow(resolved)
    assert summary["status"] == "FINISHED" and summary["updates"] == 1
    run = mlflow.tracking.MlflowClient(resolved["mlflow"]["tracking_uri"]).get_run(summary["run_id"])
    assert run.data.params["task.name"] == "gentasks.game24" and "train/loss" in run.data.metrics
