"""Dashboard API latency does not grow with the pool: 10x more steps, about the same warm latency
per endpoint (a full scan per request would take ~10x longer). Comparative, not absolute."""

from __future__ import annotations

import pytest
from bench_dashboard import run

pytestmark = pytest.mark.slow

SLACK_MS = 25.0  # timer noise on a shared 2-core machine


def test_endpoint_latency_is_flat_in_pool_size(tmp_path) -> None:
    small, _, _ = run(10_000, tmp_path / "small.db")
    large, naive_large, _ = run(100_000, tmp_path / "large.db")
    ratios = {}
    for name, (_, warm_small) in small.items():
        if name.startswith("(") or warm_small != warm_small:  # not an endpoint / cold-only (NaN)
            continue
        warm_large = large[name][1]
        ratios[name] = (warm_large + SLACK_MS) / (warm_small + SLACK_MS)
    bad = {k: round(v, 1) for k, v in ratios.items() if v > 4.0}
    assert not bad, f"warm latency grew with the pool (10x steps): {bad}; all: {ratios}"
    # no request waits for the pool-wide scan: the first collection call is bounded by first_wait_s
    assert large["collection (cold: starts the snapshot)"][0] < 1000 + 1500
