"""What OS isolation costs the research agent: one sandboxed step under bubblewrap vs the guard.

Runs the same generated package (the scripted game24 task of the tests, fixed reward) through the
``check`` mode and the dry run (``episodes`` mode: gateway + echo policy + 2 groups x 4 episodes
inside the sandbox) alternately under ``bubblewrap`` and ``guard``, ``--repeats`` times each, and
prints the median wall seconds and CPU seconds per mode and the bubblewrap/guard ratios. CPU
seconds are the sandboxed Python process's own (it reports them; bwrap's set-up is in the wall
time only) and are less distorted than wall time on a busy machine.

Run: ``.venv/bin/python benchmarks/research_agent_isolation_bench.py [--repeats 5]`` (needs bwrap).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "research_agent"))

from ra_scripted import INIT, README, REWARD_FIXED, SPEC, TESTS  # noqa: E402

from research_agent.isolation import detect  # noqa: E402
from research_agent.sandbox import Limits, run_sandboxed  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    iso = detect("bubblewrap")
    with tempfile.TemporaryDirectory(prefix="ra-bench-") as tmp:
        root = Path(tmp)
        root.chmod(0o755)
        pkg = root / "benchpkg" / "game24"
        pkg.mkdir(parents=True)
        for name, body in {"__init__.py": INIT, "reward.py": REWARD_FIXED, "README.md": README,
                           "test_reward.py": TESTS}.items():
            (pkg / name).write_text(body)
        check = {"module": "benchpkg.game24", "low": 0.0, "high": 1.0, "seeds": 8,
                 "examples": SPEC["reward"]["examples"]}
        dry = {"module": "benchpkg.game24", "task": "game24", "groups": 2, "group_size": 4, "max_tokens": 12,
               "seed": 0, "policy": "echo", "model_path": None}
        times: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for _ in range(args.repeats):
            for mode, payload in (("check", check), ("episodes", dry)):
                for isolation in (iso, "guard"):
                    name = "bubblewrap" if isolation is iso else "guard"
                    t0 = time.perf_counter()
                    res = run_sandboxed(mode, payload, root, Limits(timeout_s=300), isolation)
                    assert res.ok, res.error
                    times.setdefault((mode, name), []).append((time.perf_counter() - t0, res.data["cpu_s"]))
    print(f"{iso.describe()}\ncores: {os.cpu_count()}, load average: {os.getloadavg()[0]:.2f}, "
          f"repeats: {args.repeats}")
    for mode in ("check", "episodes"):
        med = {n: (statistics.median(w for w, _ in times[(mode, n)]), statistics.median(c for _, c in times[(mode, n)]))
               for n in ("bubblewrap", "guard")}
        b, g = med["bubblewrap"], med["guard"]
        print(f"{mode:9s} wall s: bubblewrap {b[0]:.2f}  guard {g[0]:.2f}  ratio {b[0] / g[0]:.2f} | "
              f"CPU s: bubblewrap {b[1]:.2f}  guard {g[1]:.2f}  ratio {b[1] / g[1]:.2f}")


if __name__ == "__main__":
    main()
