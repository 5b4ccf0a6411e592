"""tests/experiments/test_verifiers.py in the venv layered on the project's that `make test` builds
(`.venv-verifiers`: verifiers 0.4.0 pins openai<3, which this venv's openai 3.x and the agents extra refuse)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PY = REPO / ".venv-verifiers" / "bin" / "python"


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("verifiers") is not None,
                    reason="verifiers is importable here: test_verifiers.py runs in this venv directly")
def test_the_verifiers_adapter_passes_in_its_layered_venv() -> None:
    if not PY.exists():
        if os.environ.get("CI"):
            pytest.fail(".venv-verifiers is missing: `make test` builds it before running the tests")
        pytest.skip("no .venv-verifiers: `make test` builds it (experiments/verifiers/README.md)")
    done = subprocess.run([str(PY), "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "tests/experiments/test_verifiers.py"],
                          cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "4 passed" in out and "skipped" not in out, out[-4000:]
