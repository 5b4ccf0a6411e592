"""The training journal: one JSON line per update (which lease, which steps, which process) and
per resume, next to the checkpoints, so "was any step trained twice?" is a question with an answer.
:func:`append` writes a line (flushed: a SIGKILL keeps it); :func:`audit` replays a journal: an update
survives when no later resume went back before it, and survivors must name every step at most once.
It does not checkpoint or lease anything.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

__all__ = ["append", "read", "audit"]


def append(path: str | Path, record: dict[str, Any]) -> None:
    """Append one record (with this process id) as a JSON line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps({**record, "pid": os.getpid()}) + "\n")
        f.flush()


def read(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:  # a line cut by a kill while it was written: that update never finished
            continue
    return out


def audit(path: str | Path) -> dict[str, Any]:
    """Replay a journal: surviving updates, steps trained twice among them, updates lost to crashes."""
    surviving: list[dict[str, Any]] = []
    lost = 0
    for rec in read(path):
        if rec.get("event") == "resume":  # weights went back to update k: later ones are gone
            keep = [u for u in surviving if u["update"] <= rec["update"]]
            lost += len(surviving) - len(keep)
            surviving = keep
        elif rec.get("event") == "update":
            surviving.append(rec)
    counts = Counter(sid for u in surviving for sid in u["steps"])
    twice = sorted(sid for sid, n in counts.items() if n > 1)
    return {"updates": len(surviving), "lost_updates": lost, "steps": len(counts), "trained_twice": twice,
            "step_ids": set(counts)}
