"""benchmarks/overhead_check.py: its figures and last line at a tiny size, and a deliberate slowdown caught and named."""

from __future__ import annotations

import re

import pytest

LAST = re.compile(r"^overhead: gateway (\d+\.\d+)x \(limit [\d.]+\), update (\d+\.\d+)x \(limit [\d.]+\): (ok|REGRESSED .+)$")


def test_the_verdict_names_the_phase_that_grew_past_its_share(load_bench):
    oc = load_bench("overhead_check")
    assert oc.parse_slowdowns(["publish=0.5", "gateway.pool=0.01"]) == {"publish": 0.5, "gateway.pool": 0.01}
    with pytest.raises(SystemExit, match="PHASE one of"):
        oc.parse_slowdowns(["settle=1"])
    # a phase that is big by design (training) is not named when a small one grew past its expected share
    name, _ = oc.excess({"time/train_s": 1.0, "time/lease_s": 0.6}, 1.0, {"time/train_s": 1.0, "time/lease_s": 0.1})
    assert name == "time/lease_s"
    g = {"ratio": 2 * oc.GATEWAY_LIMIT, "phases_ms": {"gateway.pool": 5.0, "gateway.rest": 1.0}, "ref_ms": 1.0}
    u = {"ratio": 0.5 * oc.UPDATE_LIMIT, "time_keys": {"time/update_wall_s": 9.0, "time/train_s": 1.0}, "ref_s": 1.0}
    line, regressed = oc.verdict(g, u)
    assert regressed and LAST.match(line) and line.endswith("REGRESSED gateway.pool")
    line, regressed = oc.verdict({**g, "ratio": 1.0}, u)
    assert not regressed and line.endswith(": ok")


@pytest.mark.slow
def test_a_deliberate_slowdown_fails_the_check(capsys, load_bench):
    """Both sides for real at a tiny size (4 clients for 0.5 s, a warm-up and one measured update): each slowed phase is caught and named."""
    oc = load_bench("overhead_check")
    rc = oc.main(["--clients", "4", "--duration", "0.5", "--gateway-rounds", "1", "--update-rounds", "1",
                  "--slowdown", "gateway.backend=0.02", "--slowdown", "publish=0.5"])
    out = capsys.readouterr().out
    assert rc == 1
    for figure in ("bare ", "gateway.backend", "gateway.rest", "gateway.pool", "bare Trainer.update",
                   "time/update_wall_s", "time/train_s", "time/publish_stage_s"):
        assert figure in out, figure
    m = LAST.match(out.strip().splitlines()[-1])
    assert m, out[-2000:]
    assert float(m.group(1)) > oc.GATEWAY_LIMIT and float(m.group(2)) > oc.UPDATE_LIMIT
    assert m.group(3) == "REGRESSED gateway.backend, time/publish_stage_s"
