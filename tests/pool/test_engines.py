"""Pool engines: the registry (swarm.pool.engines), open_pool, the built-in kinds' settings, and a toy engine
declared out of tree (toy_plugin/memory_engine.py) serving a real pool and the app without a project edit."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from swarm.app import create_app
from swarm.errors import ConfigError, ValidationError
from swarm.policy.echo import EchoBackend
from swarm.pool import ENGINES, Pool, StepFilter, open_pool
from swarm.pool.engines import engine_kind, engine_section
from swarm.records import Episode, Step

TOY = "toy_plugin.memory_engine"


def _fill(pool: Pool) -> Episode:
    ep = pool.add_episode(Episode(task="t", group_id="g", metadata={"seat": 1}))
    pool.add_steps([Step(episode_id=ep.episode_id, index=i, prompt_ids=list(range(90)), response_ids=[7, 8, i],
                         metadata={"turn": i}) for i in range(3)])
    pool.end_episode(ep.episode_id, reward=1.0)
    return ep


def test_the_built_in_kinds_are_the_modules_of_the_package() -> None:
    assert {"sqlite", "postgresql"} <= set(ENGINES.builtins())
    assert engine_kind("sqlite:///x.db") == "sqlite" and engine_kind("postgresql+psycopg://u@h/db") == "postgresql"


def test_open_pool_takes_the_engines_settings_once(tmp_path: Path) -> None:
    with open_pool(f"sqlite:///{tmp_path / 'p.db'}", busy_timeout_s=2.5, block_size=16) as pool:
        assert (pool.sql.busy_timeout_s, pool.block_size, pool.single_writer) == (2.5, 16, True)
    section = engine_section(f"sqlite:///{tmp_path / 'q.db'}", pool_size=2)
    assert section.model_dump()["engine"] == "sqlite"
    with open_pool(**section.model_dump()) as pool:  # a validated pool section opens as is
        assert pool.sql.pool_size == 2


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"busy_timeout": 1}, "pool.busy_timeout: unknown key (did you mean pool.busy_timeout_s?)"),
    ({"busy_timeout_s": 0}, "pool.busy_timeout_s=0: Input should be greater than 0"),
    ({"block_size": 0}, "pool.block_size=0"),
    ({"pre_ping": False}, "pool.pre_ping: unknown key"),  # PostgreSQL's setting, not SQLite's
    ({"engine": "nope"}, "pool.engine=nope: unknown; use one of postgresql, sqlite"),
])
def test_bad_settings_name_the_key(tmp_path: Path, kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        open_pool(f"sqlite:///{tmp_path / 'p.db'}", **kwargs)


def test_an_unknown_scheme_is_refused_as_before() -> None:
    with pytest.raises(ValidationError, match="unsupported database 'mysql'"):
        open_pool("mysql://x/y")
    with pytest.raises(ValidationError, match="not a database URL"):
        Pool("::")


def test_a_toy_engine_declared_out_of_tree_serves_a_whole_pool() -> None:
    with open_pool("sqlite://", engine=TOY, cache_kib=512) as pool:
        assert TOY in ENGINES.kinds() and TOY not in ENGINES.builtins()
        assert type(pool.sql).__module__ == TOY and pool.sql.cache_kib == 512
        with pool.engine.connect() as c:
            assert c.exec_driver_sql("PRAGMA cache_size").scalar() == -512  # its own setting took effect
        ep = _fill(pool)
        assert pool.count_steps(StepFilter(metadata={"turn": 2})) == 1  # JSON through the engine's dialect
        assert pool.count_steps(StepFilter(group_ids=["g"])) == 3
        lease = pool.lease(StepFilter.trainable("default"), max_groups=1)
        assert len(lease.steps) == 3 and pool.ack(lease.lease_id, consumed_version=1) == 3
        assert pool.overview.recent_leases(1)[0]["state"] == "acked"
        assert [r["seat"] for r in pool.overview.step_rows(StepFilter(episode_id=ep.episode_id), 10)] == [1, 1, 1]
    with pytest.raises(ConfigError, match=r"pool.cache_kib=8: Input should be greater than or equal to 64"):
        open_pool("sqlite://", engine=TOY, cache_kib=8)


def test_the_app_serves_a_pool_on_the_toy_engine() -> None:
    with open_pool("sqlite://", engine=TOY) as pool:
        ep = _fill(pool)
        with TestClient(create_app(pool, EchoBackend()), base_url="http://127.0.0.1") as http:
            assert http.get("/v1/pool/stats").json()["steps"]["total"] == 3
            assert http.get(f"/v1/pool/episodes/{ep.episode_id}").json()["reward"] == 1.0
            assert http.get("/dashboard/api/steps").json()["data"][0]["episode_id"] == ep.episode_id
