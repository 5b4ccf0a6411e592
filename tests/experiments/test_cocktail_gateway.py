"""The cocktail task through a real gateway (EchoBackend) and the real worker: episodes land under each sub-task."""

from __future__ import annotations

from pathlib import Path

import experiments.cocktail as cocktail
from swarm.app import GatewaySettings, create_app
from swarm.client.worker import WorkerConfig, run_worker
from swarm.policy.echo import EchoBackend
from swarm.pool import Pool
from swarm.pool.filter import StepFilter
from swarm.stack import ServerThread


def test_cocktail_episodes_are_recorded_per_sub_task(tmp_path: Path) -> None:
    pool = Pool(f"sqlite:///{tmp_path / 'pool.db'}")
    server = ServerThread(create_app(pool, EchoBackend(), GatewaySettings())).start()
    try:
        seeds = range(100, 106)
        expected = {s: cocktail.make_instance(s)["task"] for s in seeds}
        assert set(expected.values()) == {"echo", "math"}
        stats = run_worker(WorkerConfig(server=server.url, task="cocktail", workers=1, group_size=1,
                                        max_groups=len(seeds), seed=seeds[0], max_tokens=64))
        assert stats["episodes"] == len(seeds) and stats["failed"] == 0
        for s in seeds:
            (ep,) = pool.query_episodes(StepFilter(group_id=f"cocktail-{s}"))
            assert ep.task == expected[s] and ep.status.value == "finished"
    finally:
        server.stop()
