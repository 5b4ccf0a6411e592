"""Every task package under experiments/ declares one TaskOptions model: unknown keys refused with the key path, near misses named."""

from __future__ import annotations

import pkgutil
from pathlib import Path

import pytest

import experiments
from swarm.client.options import TaskOptions
from swarm.client.task import check_options, load_task
from swarm.settings import Section

TASKS = sorted(m.name for m in pkgutil.iter_modules(experiments.__path__) if m.ispkg)
FIELDS = [(name, field) for name in TASKS for field in load_task(name).module.Options.model_fields]  # type: ignore[union-attr]


def test_the_task_list_is_complete() -> None:
    assert set(TASKS) >= {"arithmetic", "cocktail", "echo", "math", "openenv", "reasoning_gym", "textarena",
                          "verifiers", "werewolves"}


@pytest.mark.parametrize("name", TASKS)
def test_each_task_declares_one_options_model(name: str) -> None:
    module = load_task(name).module
    assert issubclass(module.Options, TaskOptions) and issubclass(module.Options, Section)  # type: ignore[union-attr]
    module.Options()  # every option has a default: `+task=<name>` alone is a valid run
    source = "\n".join(p.read_text() for p in Path(module.__file__).parent.glob("*.py"))  # type: ignore[arg-type, union-attr]
    assert "def check_options" not in source and "from_options(" not in source and "def configure" not in source


@pytest.mark.parametrize("name", TASKS)
def test_an_unknown_option_is_refused_with_its_key(name: str) -> None:
    with pytest.raises(ValueError, match=r"^task\.options\.typo: unknown key"):
        check_options(load_task(name), {"typo": 1})


@pytest.mark.parametrize(("name", "field"), FIELDS)
def test_a_near_miss_names_the_close_key(name: str, field: str) -> None:
    with pytest.raises(ValueError, match=rf"task\.options\.{field}{field[-1]}: unknown key \(did you mean "
                                         rf"task\.options\.{field}\?\)"):
        check_options(load_task(name), {field + field[-1]: 1})


def test_the_issue_examples() -> None:
    with pytest.raises(ValueError, match=r"task\.options\.typo: unknown key"):  # +task=math +task.options.typo=1
        check_options(load_task("math"), {"typo": 1})
    with pytest.raises(ValueError, match=r"task\.options\.max_operant: unknown key \(did you mean task\.options\.max_operand\?\)"):
        check_options(load_task("arithmetic"), {"max_operant": 19})
    with pytest.raises(ValueError, match=r"task\.options\.trainable_side=wolf: Input should be 'wolves' or 'village'"):
        check_options(load_task("werewolves"), {"trainable_side": "wolf"})
