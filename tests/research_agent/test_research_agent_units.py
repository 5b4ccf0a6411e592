"""Research agent units: LLM settings and the not-configured message, spec parsing, file parsing, task config."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ra_scripted import SPEC, files_answer

from research_agent.__main__ import main, train_command
from research_agent.errors import LLMError, LLMNotConfigured, SpecError
from research_agent.generate import EXPERIMENTS, parse_files, target_for, write_task_config
from research_agent.llm import load_agent_config, load_settings
from research_agent.spec import extract_json, parse_spec


@pytest.fixture
def no_llm_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "RESEARCH_AGENT_MODEL"):
        monkeypatch.delenv(k, raising=False)


def test_no_llm_configured_stops_with_how_to(no_llm_env, capsys) -> None:
    with pytest.raises(LLMNotConfigured, match="OPENAI_BASE_URL"):
        load_settings(load_agent_config())
    assert main(["train the policy to play 24"]) == 2
    out = capsys.readouterr().out
    assert "No LLM is configured" in out and "--model" in out


def test_settings_precedence(no_llm_env, monkeypatch) -> None:
    cfg = load_agent_config("local_vllm")  # merges default.yaml through its defaults list
    assert cfg["validate"]["policy"] == "tiny"
    s = load_settings(cfg)
    assert s.base_url == "http://127.0.0.1:8000/v1" and s.model.startswith("Qwen/")
    monkeypatch.setenv("RESEARCH_AGENT_MODEL", "from-env")
    assert load_settings(cfg).model == "from-env"
    assert load_settings(cfg, model="from-flag").model == "from-flag"


def test_spec_parsing_names_the_bad_field() -> None:
    spec = parse_spec(SPEC, description="play 24")
    assert spec.name == "game24" and spec.reward.examples[0].reward == 1.0
    assert parse_spec(SPEC, name="my24").name == "my24"
    bad = {**SPEC, "reward": {**SPEC["reward"], "examples": SPEC["reward"]["examples"][:1]}}
    with pytest.raises(SpecError, match="reward.examples"):
        parse_spec(bad)
    with pytest.raises(SpecError, match="outside"):
        parse_spec({**SPEC, "reward": {**SPEC["reward"], "high": 0.5}})
    with pytest.raises(SpecError, match="name"):
        parse_spec({**SPEC, "name": "Bad Name"})
    assert extract_json('sure!\n```json\n{"a": 1}\n```') == {"a": 1}
    with pytest.raises(LLMError):
        extract_json("no json here")


def test_file_parsing_and_task_config(tmp_path: Path) -> None:
    files = parse_files(files_answer({"__init__.py": "x = 1\n", "README.md": "# t\n```bash\nrun\n```\n"}))
    assert files == {"__init__.py": "x = 1\n", "README.md": "# t\n```bash\nrun\n```\n"}
    with pytest.raises(LLMError, match="not allowed"):
        parse_files("<<<FILE ../evil.py>>>\nx\n<<<END>>>")
    spec = parse_spec(SPEC)
    target = target_for(spec, tmp_path / "gentasks", tmp_path / "conf")
    assert target.module == "gentasks.game24" and target.import_root == tmp_path
    text = write_task_config(target, spec).read_text()
    assert text.startswith("# @package _global_\n")
    assert yaml.safe_load(text) == {"task": {"name": "gentasks.game24", "group_size": 4, "max_tokens": 12},
                                    "batching": {"min_groups": 2}}
    assert target_for(spec, EXPERIMENTS).module == "game24"
    cmd, env = train_command(target)
    assert cmd[-1] == "+task=game24" and "--config-dir" in cmd and env == {"PYTHONPATH": str(tmp_path)}
