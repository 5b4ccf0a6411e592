"""The SDK's one options seam: validation into a task's Options, its check(), the process's current options, older packages."""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel, Field

from swarm.client.options import TaskOptions, import_optional, reset_options, task_options
from swarm.client.task import TaskPackage, check_options, configure_task


class Options(TaskOptions):
    alpha: float = Field(default=1.0, ge=0)
    names: list[str] = Field(default_factory=list)

    def check(self) -> None:
        if "missing" in self.names:
            import_optional("swarm_no_such_library", "the toy task needs swarm_no_such_library: pip install it")


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    yield
    reset_options()


def package(**attrs: Any) -> TaskPackage:
    mod = types.ModuleType("toy")
    for k, v in attrs.items():
        setattr(mod, k, v)
    return TaskPackage("toy", lambda s: {}, None, module=mod)


def test_values_are_validated_with_the_key_path() -> None:
    toy = package(Options=Options)
    assert check_options(toy, {"alpha": 2}) == Options(alpha=2.0)
    with pytest.raises(ValueError, match=r"^task\.options\.alpah: unknown key \(did you mean task\.options\.alpha\?\)$"):
        check_options(toy, {"alpah": 2})
    with pytest.raises(ValueError, match=r"^task\.options\.alpha=-1: Input should be greater than or equal to 0$"):
        check_options(toy, {"alpha": -1})
    with pytest.raises(ValueError, match=r"task\.options\.names\.1=2: Input should be a valid string"):
        check_options(toy, {"names": ["a", 2]})
    with pytest.raises(ValueError, match=r"alpha=x: .*; task\.options\.beta: unknown key"):  # every problem, one line
        check_options(toy, {"alpha": "x", "beta": 1})


def test_check_runs_and_a_missing_library_is_a_value_error_saying_what_to_install() -> None:
    with pytest.raises(ValueError, match="^the toy task needs swarm_no_such_library: pip install it$"):
        check_options(package(Options=Options), {"names": ["missing"]})


def test_a_package_without_options_takes_none() -> None:
    assert check_options(package(), {}) == TaskOptions()
    with pytest.raises(ValueError, match=r"task\.options\.alpha: unknown key"):
        check_options(package(), {"alpha": 1})


def test_the_worker_makes_them_current_once() -> None:
    assert Options.current() == Options()  # the defaults before any run
    opts = configure_task(package(Options=Options), {"alpha": 3})
    assert Options.current() is opts and opts.alpha == 3.0
    reset_options()
    assert Options.current().alpha == 1.0


def test_an_older_package_with_a_plain_model_and_configure_still_works() -> None:
    class Plain(BaseModel):  # extra="ignore" by default: unknown keys are refused all the same
        alpha: float = 1.0

    seen: dict[str, Any] = {}
    older = package(Options=Plain, configure=lambda **kw: seen.update(kw))
    with pytest.raises(ValueError, match=r"task\.options\.alpah: unknown key \(did you mean task\.options\.alpha\?\)"):
        check_options(older, {"alpah": 2})
    assert isinstance(configure_task(older, {"alpha": 2}), Plain) and seen == {"alpha": 2.0}
    assert task_options(older.module, {}).alpha == 1.0  # type: ignore[arg-type]


def test_import_optional_names_a_missing_dependency_of_a_present_library_as_itself() -> None:
    assert import_optional("json", "never said").dumps(1) == "1"
    with pytest.raises(ImportError, match="^pip install x$"):
        import_optional("swarm_no_such_library.sub", "pip install x")
