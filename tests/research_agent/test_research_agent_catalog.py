"""The research agent's catalog: a request a reasoning-gym generator or TextArena game fits is configured, not
generated (no LLM)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from research_agent.__main__ import main
from research_agent.catalog import match_generator, match_request

pytest.importorskip("reasoning_gym", reason="reasoning-gym is not installed (pip install 'swarmpool[envs]')")

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("request_text", "generator"), [
    ("train it on basic arithmetic", "basic_arithmetic"),
    ("Teach the model to spell words backward", "spell_backward"),
    ("I want it to get better at prime factorization", "prime_factorization"),
    ("practise multiplication", "products"),
    ("solve the tower of hanoi", "tower_of_hanoi"),
])
def test_requests_that_name_a_generator_match_it(request_text: str, generator: str) -> None:
    match = match_generator(request_text)
    assert match is not None and match.generator == generator and match.task == "reasoning_gym"


@pytest.mark.parametrize("request_text", [
    "Train the policy to play 24: given four numbers, answer an expression that equals 24",
    "summarise product reviews politely",     # 'products' alone is too generic to mean the generator
    "negotiate a price with a seller",
])
def test_other_requests_go_to_the_llm(request_text: str) -> None:
    assert match_generator(request_text) is None


def test_a_named_game_picks_the_textarena_task() -> None:
    pytest.importorskip("textarena", reason="textarena is not installed (pip install 'swarmpool[envs]')")
    match = match_request("Teach the agent to play Tic-Tac-Toe against a rule-based opponent")
    assert match is not None and match.task == "textarena"
    assert match.task_options() == {"env_id": "TicTacToe-v0-train", "opponent": "heuristic"}
    assert match_request("get good at othello").task_options()["opponent"] == "random"
    assert match_request("train it on basic arithmetic").task == "reasoning_gym"


def _compose(conf: Path, task: str) -> dict:
    with initialize_config_dir(config_dir=str(conf), version_base=None):
        return OmegaConf.to_container(compose(config_name="train", overrides=[f"+task={task}"]), resolve=False)


def test_basic_arithmetic_request_configures_the_reasoning_gym_task(tmp_path: Path, monkeypatch, capsys) -> None:
    """No LLM configured, no package written: conf/task/basic_arithmetic.yaml composes to the reasoning_gym task."""
    for key in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "RESEARCH_AGENT_MODEL"):
        monkeypatch.delenv(key, raising=False)
    conf = tmp_path / "conf"
    shutil.copytree(REPO / "conf", conf)
    out = tmp_path / "gentasks"
    assert main(["train it on basic arithmetic", "--conf-dir", str(conf), "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "no code is generated" in said and "+task=basic_arithmetic" in said
    assert not out.exists()
    cfg = _compose(conf, "basic_arithmetic")
    assert cfg["task"]["name"] == "reasoning_gym" and cfg["task"]["options"]["dataset"] == "basic_arithmetic"
    # a second run replaces its own file; a built-in name is refused
    assert main(["train it on basic arithmetic", "--conf-dir", str(conf)]) == 0
    assert main(["train it on basic arithmetic", "--conf-dir", str(conf), "--name", "math"]) == 2


def test_tic_tac_toe_request_configures_the_textarena_task(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("textarena", reason="textarena is not installed (pip install 'swarmpool[envs]')")
    for key in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "RESEARCH_AGENT_MODEL"):
        monkeypatch.delenv(key, raising=False)
    conf = tmp_path / "conf"
    shutil.copytree(REPO / "conf", conf)
    assert main(["teach it tic tac toe", "--conf-dir", str(conf)]) == 0
    cfg = _compose(conf, "tictactoe")
    assert cfg["task"]["name"] == "textarena" and cfg["task"]["options"]["env_id"] == "TicTacToe-v0-train"
