"""benchmarks/generation_bench.py runs on the CPU: every column (peft, merged copy, static slots, generate) and the last line."""

from __future__ import annotations


def test_generation_bench_runs_on_cpu(capsys, load_bench):
    assert load_bench("generation_bench").main(["--calls", "2,4", "--tokens", "4", "--reps", "1", "--slots", "64"]) == 0
    out = capsys.readouterr().out
    assert "| hf tok/s | hf merged tok/s | generate tok/s |" in out and "hf slots tok/s" in out
    rows = [line for line in out.splitlines() if line.startswith("| 2 |") or line.startswith("| 4 |")]
    assert len(rows) == 2
    last = out.strip().splitlines()[-1]
    assert last.startswith("generation: hf/generate = ") and "merged/generate = " in last
