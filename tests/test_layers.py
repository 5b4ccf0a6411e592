"""The import contracts of pyproject.toml's [tool.importlinter] hold: `lint-imports`, one test per contract."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


@pytest.mark.parametrize("contract", ["top", "swarm", "acyclic", "pool-roles"])
def test_import_contract(contract: str) -> None:
    if not LINT.exists():
        pytest.skip("import-linter is not installed (pip install -e '.[dev]')")
    run = subprocess.run([str(LINT), "--no-cache", "--contract", contract], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, f"lint-imports --contract {contract} failed:\n{run.stdout}\n{run.stderr}"
