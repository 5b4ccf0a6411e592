"""Every ``python -m flows.train`` / ``flows.serve`` / ``flows.eval`` command written in README.md, docs/ and the
experiments' READMEs composes and validates as written: the same compose + ``cli_config`` (train, eval) or
``ServeConfig`` (serve) checks the command line runs before anything starts, so a renamed key, a
removed option or a task file that went away fails here instead of in a reader's terminal.

Commands with placeholders (``<name>``, ``...``) or their own config directory (``--config-dir``: the
verifiers task runs in its own venv) are not runnable as written and are skipped by design.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted(REPO.glob("experiments/*/README.md"))]
_CODE = re.compile(r"```[a-z]*\n(.*?)```|`([^`\n]+)`", re.S)  # fenced blocks and inline code spans


def _commands() -> list[tuple[str, str, list[str]]]:
    """(where, flow, overrides) for each runnable flows.train / flows.serve / flows.eval command in a code block."""
    found: dict[tuple[str, tuple[str, ...]], str] = {}
    for doc in DOCS:
        for fenced, inline in _CODE.findall(doc.read_text()):
            block = fenced or inline
            for line in block.replace("\\\n", " ").splitlines():
                m = re.search(r"python -m flows\.(train|serve|eval)\b(.*)", line)
                if not m or "|" in m.group(2):  # a diagram, not a command
                    continue
                try:
                    args = shlex.split(m.group(2), comments=True)
                except ValueError:
                    continue
                if any(a.startswith("--config") for a in args) or any(
                        "<" in a or "..." in a or "=" not in a for a in args if a[0] != "-"):
                    continue
                overrides = [a for a in args if a[0] != "-"]
                found.setdefault((m.group(1), tuple(overrides)), f"{doc.relative_to(REPO)}: {line.strip()[:90]}")
    return [(where, flow, list(ov)) for (flow, ov), where in found.items()]


COMMANDS = _commands()


def test_the_docs_hold_commands() -> None:
    flows = {flow for _, flow, _ in COMMANDS}
    assert len(COMMANDS) >= 25 and flows == {"train", "serve", "eval"}, COMMANDS


@pytest.mark.parametrize("where,flow,overrides", COMMANDS, ids=[w for w, _, _ in COMMANDS])
def test_documented_command_validates(where: str, flow: str, overrides: list[str], tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from flows.config import ServeConfig, validate
    from flows.train import cli_config

    monkeypatch.setenv("SWARM_POOL_URL", "")  # the documented pool.url is checked (sqlite: a folder is made)
    monkeypatch.chdir(tmp_path)  # relative sqlite paths land in the test's folder
    extra = [f"train.out_dir={tmp_path}"] if flow == "train" else []
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose(config_name=flow, overrides=[*overrides, *extra])
    if flow == "train":
        cli_config(cfg, overrides)
    elif flow == "eval":
        from flows.eval import cli_config as eval_config

        eval_config(OmegaConf.to_container(cfg, resolve=True))
    else:
        validate(OmegaConf.to_container(cfg, resolve=True), schema=ServeConfig)
