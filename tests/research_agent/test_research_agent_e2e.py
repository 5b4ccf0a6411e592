"""Plain English -> validated task -> one training update: the CLI with a scripted fake LLM whose
first package has a real bug (the repair loop runs), then ``--train`` with Hydra overrides runs
``flows.train`` on the user's conf dir (its edits win) from the user's directory."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlflow
import pytest
import yaml
from ra_scripted import game24_script

from research_agent.__main__ import main

REPO = Path(__file__).resolve().parents[2]
DESCRIPTION = ("Train the policy to play 24: given four numbers, answer an expression that equals 24; "
               "reward 1 if valid and correct, 0.2 if valid but wrong")


@pytest.mark.slow
def test_description_to_trained_task(tmp_path: Path, fake_llm, monkeypatch, capsys) -> None:
    llm = fake_llm(game24_script)
    conf = tmp_path / "conf"
    shutil.copytree(REPO / "conf", conf)
    # the user's own edit of their copy must win over the repository's conf/
    train_yaml = conf / "train.yaml"
    train_yaml.write_text(train_yaml.read_text().replace("  updates: 100 ", "  updates: 1 "))
    out = tmp_path / "gentasks"
    monkeypatch.chdir(tmp_path)
    rc = main([DESCRIPTION, "--out", str(out), "--conf-dir", str(conf), "--max-attempts", "3",
               "--base-url", llm.url, "--api-key", "test-key", "--model", "fake-coder",
               "--train", f"mlflow.tracking_uri=sqlite:///{tmp_path / 'ml.db'}", f"train.out_dir={tmp_path / 'run'}",
               "batching.min_groups=1", "mlflow.sample_trajectories=1", "runner.workers=4"])
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

    # hand over: --train ran flows.train with the user's conf (updates: 1) and the overrides
    client = mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path / 'ml.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    run = runs[0]
    assert run.data.params["task.name"] == "gentasks.game24" and run.data.params["train.updates"] == "1"
    assert "train/loss" in run.data.metrics
