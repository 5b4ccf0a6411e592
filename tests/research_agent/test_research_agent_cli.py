"""The research-agent CLI against a scripted fake LLM: what an LLM returns never crashes it, the user's
config wins, nothing is half-written or lost, validation is honest (checks that cannot run fail, no
signal is said on the terminal), multi-agent tasks validate, and the guard fallback is loud."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from fastapi.responses import HTMLResponse
from ra_scripted import INIT, README, REWARD_BUGGY, REWARD_FIXED, SPEC, TESTS, duel_script, files_answer, fixed_script

from research_agent.__main__ import main, train_command
from research_agent.errors import TargetError
from research_agent.generate import GENERATED_MARK, target_for, write_task_config
from research_agent.isolation import detect
from research_agent.spec import parse_spec

REPO = Path(__file__).resolve().parents[2]
DESC = "Train the policy to play 24 with four numbers"


@pytest.fixture
def conf(tmp_path: Path) -> Path:
    """A user's copy of conf/, with no waiting between LLM retries."""
    shutil.copytree(REPO / "conf", tmp_path / "conf")
    path = tmp_path / "conf" / "research_agent" / "default.yaml"
    cfg = yaml.safe_load(path.read_text())
    cfg["llm"]["retry_wait_s"] = 0
    path.write_text(yaml.safe_dump(cfg))
    return tmp_path / "conf"


def _set_validate(conf: Path, **kv: object) -> None:
    path = conf / "research_agent" / "default.yaml"
    cfg = yaml.safe_load(path.read_text())
    cfg["validate"].update(kv)
    path.write_text(yaml.safe_dump(cfg))


def _cli(llm, conf: Path, out: Path, *extra: str) -> int:
    return main([DESC, "--out", str(out), "--conf-dir", str(conf), "--base-url", llm.url, "--api-key", "k",
                 "--model", "fake", "--policy", "echo", *extra])


def test_non_json_body_is_one_message_with_bounded_retries(fake_llm, conf, tmp_path, monkeypatch, capsys) -> None:
    llm = fake_llm(lambda messages: HTMLResponse("<html>502 upstream busy</html>", status_code=200))
    monkeypatch.chdir(tmp_path)
    assert _cli(llm, conf, tmp_path / "gentasks") == 1
    out = capsys.readouterr().out
    assert "not an OpenAI chat completion" in out and "gave up after 3 tries" in out and "Traceback" not in out
    assert len(llm.requests) == 3  # 1 + llm.retries
    saved = list(tmp_path.glob("research-agent-transcript-*.jsonl"))
    assert len(saved) == 1 and [json.loads(ln)["try"] for ln in saved[0].read_text().splitlines()] == [1, 2, 3]


def test_markup_is_printed_literally_and_no_file_blocks_are_retried(fake_llm, conf, tmp_path, capsys) -> None:
    spec = {**SPEC, "summary": "score pred[i] against gold [/ ] [bold]sum[/bold]"}

    def script(messages: list[dict]) -> str:
        if messages[0]["content"].startswith("You design"):
            return json.dumps(spec)
        return "Sure! ```python\nprint('no file blocks here')\n```"

    llm = fake_llm(script)
    out_dir = tmp_path / "gentasks"
    assert _cli(llm, conf, out_dir) == 1
    out = capsys.readouterr().out
    assert "score pred[i] against gold [/ ] [bold]sum[/bold]" in out
    assert "no usable package after 2 answers" in out
    assert len(llm.requests) == 3 and "not usable" in llm.requests[2][-1]["content"]
    transcript = (out_dir / "game24" / "research" / "transcript.jsonl").read_text().splitlines()
    assert [json.loads(ln)["stage"] for ln in transcript] == ["spec", "generate", "generate"]
    assert not (conf / "task" / "game24.yaml").exists()


def test_noop_repair_is_not_revalidated_and_the_guard_fallback_is_loud(fake_llm, conf, tmp_path, capsys) -> None:
    def script(messages: list[dict]) -> str:
        system = messages[0]["content"]
        if system.startswith("You design"):
            return json.dumps(SPEC)
        if system.startswith("You write"):
            return files_answer({"__init__.py": INIT, "reward.py": REWARD_BUGGY, "README.md": README,
                                 "test_reward.py": TESTS})
        return files_answer({"reward.py": REWARD_BUGGY})  # "fixed", but identical

    _set_validate(conf, isolation="guard")
    llm = fake_llm(script)
    out_dir = tmp_path / "gentasks"
    assert _cli(llm, conf, out_dir, "--max-attempts", "3") == 1
    out = capsys.readouterr().out
    assert "changes nothing" in out and "NOT ISOLATED" in out
    research = out_dir / "game24" / "research"
    assert sorted(p.name for p in research.glob("attempt-*")) == ["attempt-1"] and len(llm.requests) == 3
    assert "NOT ISOLATED" in (research / "attempt-1" / "validation.md").read_text()
    # nothing half-written: the failing files are kept for reading, not installed or registered
    assert (research / "attempt-1" / "files" / "reward.py").read_text() == REWARD_BUGGY
    assert not (out_dir / "game24" / "__init__.py").exists() and not (conf / "task" / "game24.yaml").exists()


def test_rerun_keeps_user_files_drops_stale_reports_and_says_no_signal(fake_llm, conf, tmp_path, capsys) -> None:
    out_dir = tmp_path / "gentasks"
    pkg = out_dir / "game24"
    (pkg / "research" / "attempt-3").mkdir(parents=True)
    (pkg / "research" / "attempt-3" / "validation.md").write_text("# Validation: FAILED\n")
    (pkg / "notes.md").write_text("my notes\n")
    (pkg / "README.md").write_text("my own readme\n")
    with_data = lambda m: (files_answer({"__init__.py": INIT, "reward.py": REWARD_FIXED, "README.md": README,  # noqa: E731
                                         "test_reward.py": TESTS, "extra.json": "[]"})
                           if m[0]["content"].startswith("You write") else fixed_script(m))
    assert _cli(fake_llm(with_data), conf, out_dir) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert (pkg / "notes.md").read_text() == "my notes\n" and (pkg / "README.md").read_text() == README
    kept = list((pkg / "research").glob("kept-*/README.md"))
    assert len(kept) == 1 and kept[0].read_text() == "my own readme\n"
    assert not (pkg / "research" / "attempt-3").exists() and (pkg / "extra.json").exists()
    assert GENERATED_MARK in (conf / "task" / "game24.yaml").read_text()
    iso = detect("auto")
    assert f"Ran with {iso.describe()}" in (pkg / "research" / "attempt-1" / "validation.md").read_text()
    # the echo policy scores a constant reward: said on the terminal with what to do about it
    assert "no training signal" in out and "denser" in out
    # a second run whose package has no extra.json removes the agent's old file, never the user's
    assert _cli(fake_llm(fixed_script), conf, out_dir) == 0
    assert not (pkg / "extra.json").exists() and (pkg / "notes.md").exists()
    assert json.loads((pkg / "research" / "manifest.json").read_text())["files"] == sorted(
        ["__init__.py", "reward.py", "README.md", "test_reward.py"])


def test_builtin_names_and_shadowed_folders_are_refused(fake_llm, conf, tmp_path, capsys) -> None:
    llm = fake_llm(fixed_script)
    assert _cli(llm, conf, tmp_path / "gentasks", "--name", "echo") == 2
    assert "built-in task" in capsys.readouterr().out and len(llm.requests) == 1
    spec = parse_spec(SPEC, name="echo")
    assert target_for(spec, tmp_path / "gentasks", conf, force=True).name == "echo"
    with pytest.raises(TargetError, match="shadow"):
        target_for(parse_spec(SPEC), tmp_path / "experiments", conf)
    (conf / "task" / "game24.yaml").write_text("# a user's own task config\ntask: {name: mine}\n")
    with pytest.raises(TargetError, match="not written by the research agent"):
        target_for(parse_spec(SPEC), tmp_path / "gentasks", conf)


def test_users_conf_dir_comes_first_and_train_takes_overrides(conf: Path, tmp_path: Path) -> None:
    train_yaml = conf / "train.yaml"
    train_yaml.write_text(train_yaml.read_text().replace("  updates: 100 ", "  updates: 2 "))
    target = target_for(parse_spec(SPEC), tmp_path / "gentasks", conf)
    write_task_config(target, parse_spec(SPEC))
    cmd, env = train_command(target, ["train.batch_timeout_s=7"])
    proc = subprocess.run(cmd + ["--cfg", "job"], cwd=tmp_path, env={**os.environ, **env},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    cfg = yaml.safe_load(proc.stdout)
    assert cfg["train"]["updates"] == 2 and cfg["train"]["batch_timeout_s"] == 7
    assert cfg["task"]["name"] == "gentasks.game24"


def test_multiagent_task_is_generated_and_validated(fake_llm, conf, tmp_path, capsys) -> None:
    out_dir = tmp_path / "gentasks"
    assert _cli(fake_llm(duel_script), conf, out_dir, "--name", "duel") == 0, capsys.readouterr().out
    report = json.loads((out_dir / "duel" / "research" / "attempt-1" / "validation.json").read_text())
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["signature run_multiagent"]["ok"] and checks["episodes finished"]["ok"]
    assert "player episodes finished in 2 of 2 games" in checks["episodes finished"]["detail"]
    assert all(len(rs) == 2 for rs in report["rewards"].values())
