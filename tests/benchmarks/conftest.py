"""Loading a script of benchmarks/ as a module (they are scripts, not a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def load_bench():
    """``load_bench(name)``: the module ``benchmarks/<name>.py``, registered in ``sys.modules``."""

    def load(name: str) -> ModuleType:
        spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        return mod

    return load
