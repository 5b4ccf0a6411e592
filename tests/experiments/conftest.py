"""Shared by the task packages' tests: each test starts on default task options. The verifiers adapter's tests need verifiers, which this venv cannot hold (it pins openai<3): in the
project's venv they are not collected here but run in `.venv-verifiers` by test_verifiers_venv.py."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

from swarm.client.options import reset_options

collect_ignore = [] if importlib.util.find_spec("verifiers") else ["test_verifiers.py"]


@pytest.fixture(autouse=True)
def _default_task_options() -> Iterator[None]:
    """Options a test made current (``Options(...).use()``) do not leak into the next test."""
    yield
    reset_options()
