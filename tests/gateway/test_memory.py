"""Peak memory of a gateway process per white-box request stays within a documented multiple of the body.

The gateway runs as ``python -m flows.serve model=echo`` (a real subprocess); its peak resident set
(``VmHWM`` in ``/proc/<pid>/status``) is read before and after one large, valid ``POST /v1/steps``.
The body is the worst case we know: dense 4-digit token ids (each ~5 bytes of JSON becomes a Python int
object plus a list slot per copy) for a policy the gateway does not serve (so any id is accepted).
Measured ~14x (byte-sized ids) to ~18x (4-digit ids); the bound is :data:`MAX_FACTOR`, the figure the
default ``max_whitebox_body_bytes`` (64 MiB -> ~1.2 GB per request at most) is sized from
(docs/reliability.md "Memory per request").
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import httpx
import pytest

from flows.serve import spawn
from swarm.gateway import GatewaySettings

REPO = Path(__file__).resolve().parents[2]

MAX_FACTOR = 24  # peak RSS growth / body size, with headroom over the measured ~18x


def peak_rss(pid: int) -> int:
    """The peak resident set of process ``pid`` in bytes (``VmHWM``)."""
    m = re.search(r"VmHWM:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    assert m is not None
    return int(m.group(1)) * 1024


def whitebox_body(mib: float, n_steps: int = 16, seed: int = 0) -> bytes:
    """A valid ``POST /v1/steps`` body of about ``mib`` MiB: dense 4-digit ids for policy ``x``."""
    rng = random.Random(seed)
    per = int(mib * 1024 * 1024 / 5 / n_steps / 2)
    steps = [{"policy": "x", "prompt_ids": [rng.randrange(1000, 10000) for _ in range(per)],
              "response_ids": [rng.randrange(1000, 10000) for _ in range(per)]} for _ in range(n_steps)]
    return json.dumps({"steps": steps}, separators=(",", ":")).encode()


def test_defaults_agree_between_code_config_and_docs() -> None:
    """conf/gateway/default.yaml sets every GatewaySettings default it names to the code's value; the docs agree."""
    import yaml

    conf = yaml.safe_load((REPO / "conf" / "gateway" / "default.yaml").read_text())
    defaults = GatewaySettings()
    for key, value in conf.items():
        if hasattr(defaults, key) and key not in ("base_url",):
            value = tuple(value) if isinstance(value, list) else value  # YAML lists are the settings' tuples
            if value is None and getattr(defaults, key) == {}:  # null in YAML: Hydra refuses a dict override of {}
                continue
            assert getattr(defaults, key) == value, (key, value, getattr(defaults, key))
    assert defaults.max_whitebox_body_bytes == 64 * 1024 * 1024
    assert "| `max_whitebox_body_bytes` | 64 MiB |" in (REPO / "docs" / "gateway.md").read_text()


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
def test_peak_memory_per_whitebox_request_is_bounded(tmp_path: Path) -> None:
    body = whitebox_body(16)
    assert len(body) <= GatewaySettings().max_whitebox_body_bytes
    gw = spawn("model=echo", f"pool.url=sqlite:///{tmp_path / 'pool.db'}")
    try:
        key = httpx.post(gw.url + "/v1/episodes", json={"task": "t"}, timeout=30).json()["api_key"]
        httpx.get(gw.url + "/v1/pool/stats", timeout=30)  # warm the read path too
        before = peak_rss(gw.proc.pid)
        r = httpx.post(gw.url + "/v1/steps", content=body, timeout=300,
                       headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        assert r.status_code == 200, r.text[:500]
        assert len(r.json()["step_ids"]) == 16
        growth = peak_rss(gw.proc.pid) - before
    finally:
        gw.stop()
    factor = growth / len(body)
    assert factor <= MAX_FACTOR, f"peak RSS grew {growth / 2**20:.0f} MiB for a {len(body) / 2**20:.0f} MiB body"
