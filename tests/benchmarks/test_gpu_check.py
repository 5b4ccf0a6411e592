"""benchmarks/gpu_check.py: skips cleanly without a GPU, and runs end to end on CPU with --small."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is present: the check would run in full")
def test_skips_without_cuda(capsys, load_bench):
    assert load_bench("gpu_check").main([]) == 0
    assert capsys.readouterr().out.strip() == "no CUDA GPU: gpu_check skipped"


@pytest.mark.slow  # 30-60 s on 2 busy cores, most of it compiling flex attention for the CPU forward
def test_cpu_smoke_runs_end_to_end(capsys, load_bench):
    assert load_bench("gpu_check").main(["--device", "cpu", "--small"]) == 0
    out = capsys.readouterr().out
    assert "| generate (hf backend) |" in out and "| flex == dense | ok:" in out
    assert "| update tree, dense |" in out and "| update none, dense |" in out
    last = out.strip().splitlines()[-1]
    assert last.startswith("gpu_check: cpu") and "flex vs dense ok" in last and "merge speedup" in last
