"""The dashboard's caches: pool-wide aggregates refreshed in the background, plus live deltas.

Totals over the whole pool (steps per source / task / policy / version, consumption, staleness,
reward per version, episodes per status) need a grouped scan: at 1M steps that is seconds, far
too slow to run on every poll. :class:`Aggregates` runs it in a background thread
(stale-while-revalidate) no more often than ``duty`` allows (a scan taking ``d`` seconds is
repeated at most every ``d / duty`` seconds, between ``min_interval_s`` and ``max_interval_s``),
and every request adds the live delta: the steps created since the snapshot's watermark, read
through the ``created_at`` index. Step counts are therefore live; per-status episode counts
other than ``open`` and reward means are as fresh as the last snapshot (its age is reported).

:class:`RateCache` keeps per-bucket step counts for the rate charts: a finished time bucket
never changes (steps are append-only), so each poll reads only the newest buckets.

:class:`MergeCache` keeps the merge savings of acknowledged leases (a trained batch never
changes). Nothing here renders or speaks HTTP.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, defaultdict
from typing import Any

from swarm.dashboard import queries
from swarm.pool import Pool

__all__ = ["Aggregates", "RateCache", "MergeCache", "summarize"]


class Aggregates:
    """Background-refreshed pool-wide aggregates for one pool (thread-safe)."""

    def __init__(self, pool: Pool, duty: float = 0.1, min_interval_s: float = 1.0, max_interval_s: float = 120.0,
                 first_wait_s: float = 1.0) -> None:
        self.pool = pool
        self.duty, self.min_interval_s, self.max_interval_s = duty, min_interval_s, max_interval_s
        self.first_wait_s = first_wait_s
        self._lock = threading.Lock()
        self._snap: dict[str, Any] | None = None
        self._refreshing = False
        self._ready = threading.Event()
        self.error: str | None = None

    def _compute(self) -> dict[str, Any]:
        t0 = time.time()
        rows = queries.breakdown(self.pool, upto=t0)
        eps = queries.episode_counts(self.pool)
        return {"rows": rows, "episodes": eps, "watermark": t0, "taken_at": t0, "took_s": time.time() - t0}

    def _interval(self, snap: dict[str, Any]) -> float:
        return min(self.max_interval_s, max(self.min_interval_s, snap["took_s"] / self.duty))

    def _refresh_bg(self) -> None:
        try:
            snap = self._compute()
            with self._lock:
                self._snap, self.error = snap, None
            self._ready.set()
        except Exception as exc:  # the database was busy or went away: report it, retry on the next request
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            with self._lock:
                self._refreshing = False

    def _start_refresh(self) -> None:
        with self._lock:
            start = not self._refreshing
            self._refreshing = True
        if start:
            threading.Thread(target=self._refresh_bg, name="dashboard-aggregates", daemon=True).start()

    def get(self) -> dict[str, Any] | None:
        """The latest snapshot; None while the very first one is still being computed.

        The first call waits up to ``first_wait_s`` for it (small pools: milliseconds), so no
        request ever blocks on a scan of a large pool; later calls refresh it in the background
        once it is older than its interval.
        """
        with self._lock:
            snap = self._snap
        if snap is None:
            self._start_refresh()
            self._ready.wait(self.first_wait_s)
            with self._lock:
                return self._snap
        if time.time() - snap["taken_at"] > self._interval(snap):
            self._start_refresh()
        return snap

    def current(self) -> dict[str, Any]:
        """Snapshot plus the live delta of steps created after its watermark, summarized."""
        snap = self.get()
        open_now = queries.open_count(self.pool)
        if snap is None:  # still warming up: live numbers only
            out = summarize([])
            out["episodes"] = _episode_summary([], open_now)
            out["snapshot"] = {"warming": True, "age_s": None, "took_s": None, "live_delta_steps": 0,
                               "refresh_every_s": None, "error": self.error}
            return out
        delta = queries.breakdown(self.pool, after=snap["watermark"])
        out = summarize(snap["rows"] + delta)
        out["episodes"] = _episode_summary(snap["episodes"], open_now)
        out["snapshot"] = {"warming": False, "age_s": round(time.time() - snap["taken_at"], 2),
                           "took_s": round(snap["took_s"], 3), "live_delta_steps": sum(r["n"] for r in delta),
                           "refresh_every_s": round(self._interval(snap), 1), "error": self.error}
        return out


def _add(d: dict[str, int], k: str, n: int) -> None:
    d[k] = d.get(k, 0) + n


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals, per-source/task/policy counts, consumption, staleness and reward per version."""
    by_source: dict[str, int] = {}
    by_task: dict[str, int] = {}
    by_policy: dict[str, int] = {}
    per_version: dict[tuple[str, int], dict[str, float]] = defaultdict(lambda: {"n": 0, "n_final": 0, "reward_sum": 0.0})
    consumed_by: dict[tuple[str, int], int] = defaultdict(int)
    staleness: dict[int, int] = defaultdict(int)
    total = consumed = tokens = 0
    for r in rows:
        n = r["n"]
        total += n
        tokens += r["tokens"]
        _add(by_source, r["source"], n)
        _add(by_task, r["task"], n)
        _add(by_policy, r["policy"], n)
        v = per_version[(r["policy"], r["version"])]
        v["n"] += n
        v["n_final"] += r["n_final"]
        v["reward_sum"] += r["reward_sum"]
        if r["consumed"] is not None:
            consumed += n
            consumed_by[(r["policy"], r["consumed"])] += n
            # staleness = the trainer's version when it leased the step (ack version - 1) - the step's version
            staleness[max(0, r["consumed"] - 1 - r["version"])] += n
    versions = [
        {"policy": p, "version": ver, "steps": int(v["n"]), "final": int(v["n_final"]),
         "reward_mean": (v["reward_sum"] / v["n_final"]) if v["n_final"] else None,
         "consumed_by_this_update": consumed_by.get((p, ver), 0)}
        for (p, ver), v in sorted(per_version.items())
    ]
    for (p, ver), n in consumed_by.items():
        if (p, ver) not in per_version:
            versions.append({"policy": p, "version": ver, "steps": 0, "final": 0, "reward_mean": None,
                             "consumed_by_this_update": n})
    versions.sort(key=lambda x: (x["policy"], x["version"]))
    return {
        "steps": {"total": total, "consumed": consumed, "tokens": tokens, "by_source": by_source,
                  "by_task": by_task, "by_policy": by_policy},
        "versions": versions,
        "staleness": dict(sorted(staleness.items())),
    }


def _episode_summary(rows: list[dict[str, Any]], open_now: int) -> dict[str, Any]:
    by_status: dict[str, int] = {"open": 0, "finished": 0, "abandoned": 0, "failed": 0}
    by_task: dict[str, int] = {}
    by_type: dict[str, int] = {}
    for r in rows:
        if r["status"] != "open":
            _add(by_status, r["status"], r["n"])
        _add(by_task, r["task"], r["n"])
        _add(by_type, r["type"], r["n"])
    by_status["open"] = open_now  # live
    return {"by_status": by_status, "by_task": by_task, "by_type": by_type, "total": sum(by_status.values())}


class RateCache:
    """Steps per time bucket and source; finished buckets are cached, the newest re-read."""

    def __init__(self, pool: Pool, settle_s: float = 5.0, max_buckets: int = 20_000) -> None:
        self.pool = pool
        self.settle_s = settle_s
        self.max_buckets = max_buckets
        self._cache: dict[tuple[float, int], dict[str, int]] = {}
        self._lock = threading.Lock()

    def series(self, window_s: float, n_buckets: int, now: float | None = None) -> dict[str, Any]:
        now = time.time() if now is None else now
        width = max(1.0, window_s / n_buckets)
        last = int(now // width)
        first = last - n_buckets + 1
        with self._lock:
            missing = [i for i in range(first, last + 1) if (width, i) not in self._cache]
        if missing:
            got = queries.rate_buckets(self.pool, missing[0] * width, (last + 1) * width, width)
            with self._lock:
                for i in range(missing[0], last + 1):
                    if (i + 1) * width <= now - self.settle_s:  # finished and settled: never changes again
                        self._cache[(width, i)] = got.get(i, {})
                if len(self._cache) > self.max_buckets:
                    for k in sorted(self._cache, key=lambda k: k[1])[: len(self._cache) - self.max_buckets]:
                        del self._cache[k]
        else:
            got = {}
        with self._lock:
            buckets = {i: self._cache.get((width, i), got.get(i, {})) for i in range(first, last + 1)}
        sources = sorted({s for b in buckets.values() for s in b})
        return {"bucket_s": width, "start": first * width,
                "series": {s: [[(i * width), buckets[i].get(s, 0) / width] for i in range(first, last + 1)]
                           for s in sources},
                "counts": {s: sum(b.get(s, 0) for b in buckets.values()) for s in sources}}


class MergeCache:
    """Merge statistics per acknowledged lease (LRU); active leases are recomputed."""

    def __init__(self, size: int = 512) -> None:
        self._d: OrderedDict[str, Any] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def get(self, key: str) -> Any:
        with self._lock:
            if key in self._d:
                self._d.move_to_end(key)
                return self._d[key]
        return None

    def put(self, key: str, value: Any) -> None:
        with self._lock:
            self._d[key] = value
            self._d.move_to_end(key)
            while len(self._d) > self._size:
                self._d.popitem(last=False)
