"""``python -m swarm.client --server URL --task NAME --workers N``: run a task's episodes until stopped."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import threading

from swarm.client.worker import WorkerConfig, run_worker


def _watch_parent(parent: int, stop: threading.Event) -> None:
    """Set ``stop`` once ``parent`` is no longer this process's parent (it died; we were re-parented)."""
    while not stop.wait(0.5):
        if os.getppid() != parent:
            logging.getLogger(__name__).warning("parent process %d is gone: stopping", parent)
            stop.set()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m swarm.client", description=__doc__)
    p.add_argument("--server", required=True, help="gateway URL, e.g. http://127.0.0.1:8420")
    p.add_argument("--task", required=True, help="task package name (experiments/<name>) or module path")
    p.add_argument("--workers", type=int, default=4, help="concurrent episodes")
    p.add_argument("--group-size", type=int, default=8,
                   help="episodes per prompt group: the run's task.group_size (default 8), else its groups never complete")
    p.add_argument("--model", default="default", help="policy name to request")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--episode-timeout", type=float, default=60.0)
    p.add_argument("--eval-every", type=int, default=0, help="every k-th group is an eval group")
    p.add_argument("--agree-every", type=int, default=0, help="ask for an update after every k groups (C4/C5)")
    p.add_argument("--max-groups", type=int, default=None, help="stop after this many groups")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--seeded", action="store_true", help="each call carries a sampling seed of (instance seed, member, call)")
    p.add_argument("--token", default=None, help="client token (or SWARM_CLIENT_TOKEN)")
    p.add_argument("--options", default="{}", help="task options as JSON, e.g. '{\"trainable_side\": \"wolves\"}'")
    p.add_argument("--parent", type=int, default=None,
                   help="stop when the process with this pid is gone (the flow passes its own: a killed flow leaves no worker)")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    cfg = WorkerConfig(server=a.server, task=a.task, workers=a.workers, group_size=a.group_size, model=a.model,
                       temperature=a.temperature, max_tokens=a.max_tokens, episode_timeout_s=a.episode_timeout,
                       eval_every=a.eval_every, agree_every=a.agree_every, max_groups=a.max_groups, seed=a.seed, token=a.token,
                       options=json.loads(a.options), seeded=a.seeded)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    if a.parent is not None:
        threading.Thread(target=_watch_parent, args=(a.parent, stop), daemon=True, name="parent-watch").start()
    try:
        stats = run_worker(cfg, stop)
    except KeyboardInterrupt:
        stop.set()
        return
    print(f"episodes={stats['episodes']} failed={stats['failed']} "
          f"mean_reward={stats['reward_sum'] / max(stats['episodes'], 1):.3f}")


if __name__ == "__main__":
    main()
