"""Bulk-fill a pool with a large, realistic history straight through SQL (for scale checks only).

``fill(pool, n_steps)`` writes groups of 8 episodes x 2 steps over the last 7 days: ~90% of the
steps trained in acked 64-step leases (with published versions, so staleness and reward per
version are populated), the newest ones unconsumed, a few hundred episodes still open, ~2%
failed or abandoned, three tasks, three sources. Token sequences are shared content-addressed
blocks plus inline tails, as the pool stores them. Not a test of ingestion (``Pool.add_steps``
validates every record; this skips that to build 1M steps in minutes).
"""

from __future__ import annotations

import os
import random
import time
import uuid

from swarm.pool import Pool
from swarm.pool.blocks import cut, pack_floats, pack_ids
from swarm.pool.schema import blocks, episodes, leases, policy_versions, steps

TASKS = ("math", "echo", "werewolves")
GROUP, TURNS, BATCH = 8, 2, 64


def fill(pool: Pool, n_steps: int, days: float = 7.0, seed: int = 0, chunk: int = 20_000) -> dict[str, int]:
    rng = random.Random(seed)
    now = time.time()
    t0 = now - days * 86400
    n_groups = max(1, n_steps // (GROUP * TURNS))
    total = n_groups * GROUP * TURNS
    versions = 50
    # a few prompt templates: one full 64-token block each (stored once), distinct tails per step
    templates = []
    for _ in range(16):
        ids = [rng.randrange(1000) for _ in range(64)]
        full = cut(ids, pool.block_size).blocks
        templates.append((ids, full))
    with pool._tx(write=True) as c:
        pool.sql.insert_ignore(c, blocks, [{"key": k, "tokens": t} for _, full in templates for k, t in full])
        c.execute(policy_versions.insert(), [{"policy": "default", "version": v, "adapter_path": None,
                                              "created_at": t0 + (now - t0) * v / versions, "meta": {}}
                                             for v in range(1, versions + 1)])
    consumed_upto = int(0.9 * n_groups)
    ep_rows, step_rows, lease_rows = [], [], []
    lease_id, lease_fill, lease_t = None, 0, 0.0

    def flush(final: bool = False) -> None:
        nonlocal ep_rows, step_rows
        with pool._tx(write=True) as c:
            if ep_rows:
                c.execute(episodes.insert(), ep_rows)
            if step_rows:
                c.execute(steps.insert(), step_rows)
            if final and lease_rows:  # one row per batch: small, written once complete
                c.execute(leases.insert(), lease_rows)
        ep_rows, step_rows = [], []

    for g in range(n_groups):
        frac = g / n_groups
        t_group = t0 + (now - 60 - t0) * frac
        version = int(frac * versions)
        task = TASKS[g % len(TASKS)]
        gid = f"{task}-{g}"
        consumed = g < consumed_upto
        if consumed and (lease_id is None or lease_fill + GROUP * TURNS > BATCH):
            lease_id, lease_fill, lease_t = f"lease-{uuid.uuid4().hex}", 0, t_group + 30
            cv = min(versions, version + 1)
            lease_rows.append({"lease_id": lease_id, "state": "acked", "n_steps": 0, "created_at": lease_t,
                               "expires_at": lease_t + 600, "consumed_version": cv, "filter": {"policy": "default"}})
        tmpl, full = templates[g % len(templates)]
        for e in range(GROUP):
            eid = f"ep-{uuid.uuid4().hex}"
            r = rng.random()
            status = "open" if g >= n_groups - 25 else ("failed" if r < 0.01 else "abandoned" if r < 0.02 else
                                                        "finished")
            reward = float(rng.random() < 0.3 + 0.5 * frac) if status == "finished" else None
            ep_rows.append({"episode_id": eid, "task": task, "group_id": gid, "client_id": f"worker-{g % 16}",
                            "type": "train", "status": status, "reward": reward,
                            "reward_status": "final" if reward is not None else "pending", "timeout_s": 600.0,
                            "created_at": t_group + e, "updated_at": t_group + e + 20,
                            "ended_at": None if status == "open" else t_group + e + 20, "meta": {}})
            src = "blackbox" if r < 0.9 else ("whitebox" if r < 0.98 else "service")
            for turn in range(TURNS):
                resp = [rng.randrange(1000) for _ in range(8)]
                extra = [rng.randrange(1000) for _ in range(4 + 12 * turn)]
                step_rows.append({
                    "step_id": f"step-{uuid.uuid4().hex}", "episode_id": eid, "idx": turn, "parent_step_id": None,
                    "task": task, "group_id": gid, "policy": "default", "policy_version": version, "source": src,
                    "response_id": None, "reward": None, "reward_status": "pending",
                    "created_at": t_group + e + 5 * turn, "length": 64 + len(extra) + 8, "n_prompt": 64 + len(extra),
                    "block_keys": full[0][0], "tail": pack_ids(extra + resp), "logprobs": pack_floats([-0.5] * 8),
                    "body": {"prompt_messages": [{"role": "user", "content": f"{task} #{g}"}],
                             "response_text": "...", "tool_calls": [], "finish_reason": "stop",
                             "prefix_consistent": turn > 0, "timings": {}},
                    "meta": {}, "digest": os.urandom(16),
                    "lease_id": lease_id if consumed else None,
                    "lease_expires_at": lease_t + 600 if consumed else None,
                    "consumed_version": min(versions, version + 1) if consumed else None,
                    "consumed_at": lease_t if consumed else None,
                })
                if consumed:
                    lease_fill += 1
                    lease_rows[-1]["n_steps"] += 1
        if len(step_rows) >= chunk:
            flush()
    flush(final=True)
    return {"steps": total, "episodes": n_groups * GROUP, "groups": n_groups}
