"""The task package's code version: a stable hash of its files, on every episode a worker opens, and
selectable in the pool through the episode-metadata filter (SQLite and PostgreSQL)."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import httpx
import pytest

from swarm.client import SwarmClient
from swarm.client.task import code_version, load_task
from swarm.pool import Pool, StepFilter
from swarm.records import Episode, Step

REPO = Path(__file__).resolve().parents[2]


def _package(root: Path, name: str, reward: str = "0.25") -> Path:
    """``<name>.task``: a task package (a module path with a dot, as ``load_task`` takes outside experiments/)."""
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / "__init__.py").write_text("")
    pkg = root / name / "task"
    (pkg / "__pycache__").mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("def make_instance(seed):\n    return {'seed': seed}\n\n"
                                     f"def run_episode(instance, llm):\n    return {{'reward': {reward}}}\n")
    (pkg / "words.txt").write_text("apple\nriver\n")
    return pkg


def test_code_version_hashes_the_package_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = _package(tmp_path, "cv_tasks")
    monkeypatch.syspath_prepend(str(tmp_path))
    task = load_task("cv_tasks.task")
    v1 = task.code_version
    assert len(v1) == 12 and int(v1, 16) >= 0
    assert code_version(task.module) == v1  # stable
    (pkg / "__pycache__" / "x.pyc").write_bytes(b"junk")  # bytecode does not count
    assert code_version(task.module) == v1
    (pkg / "words.txt").write_text("apple\nriver\nstone\n")  # a data file does
    v2 = code_version(task.module)
    (pkg / "__init__.py").write_text((pkg / "__init__.py").read_text().replace("0.25", "0.75"))
    v3 = code_version(task.module)
    assert len({v1, v2, v3}) == 3
    # the same files elsewhere: the same version (relative paths, not absolute ones)
    other = tmp_path / "elsewhere"
    _package(other, "cv_tasks")
    (other / "cv_tasks" / "task" / "words.txt").write_text("apple\nriver\nstone\n")
    (other / "cv_tasks" / "task" / "__init__.py").write_text((pkg / "__init__.py").read_text())
    for m in ("cv_tasks", "cv_tasks.task"):
        sys.modules.pop(m, None)
    monkeypatch.syspath_prepend(str(other))
    importlib.invalidate_caches()
    assert load_task("cv_tasks.task").code_version == v3
    for m in ("cv_tasks", "cv_tasks.task"):
        sys.modules.pop(m, None)


def test_shipped_task_has_a_code_version() -> None:
    assert len(load_task("echo").code_version) == 12


def test_client_metadata_goes_into_every_episode() -> None:
    bodies: list[dict] = []

    def answer(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json={"episode_id": "ep_1", "base_url": "http://x/v1", "api_key": "k"})

    client = SwarmClient("http://127.0.0.1:9", transport=httpx.MockTransport(answer),
                         metadata={"code_version": "abc123abc123"})
    client.begin(task="t", metadata={"seed": 3})
    client.begin(task="t", metadata={"code_version": "own"})  # the episode's own value wins
    assert bodies[0]["metadata"] == {"code_version": "abc123abc123", "seed": 3}
    assert bodies[1]["metadata"] == {"code_version": "own"}


def test_pool_selects_a_code_version(pool_url: str) -> None:
    pool = Pool(pool_url)
    try:
        eps = {}
        for v in ("aaaaaaaaaaaa", "bbbbbbbbbbbb"):
            for i in range(2):
                ep = Episode(task="echo", group_id=f"g-{v}", metadata={"code_version": v, "seed": i})
                pool.add_episode(ep)
                pool.add_steps([Step(episode_id=ep.episode_id, index=0, task="echo", group_id=f"g-{v}",
                                     prompt_ids=[1, 2], response_ids=[3], response_logprobs=[-0.5])])
                eps.setdefault(v, set()).add(ep.episode_id)
        for v, want in eps.items():
            f = StepFilter(metadata={"code_version": v})
            assert {e.episode_id for e in pool.query_episodes(f, limit=100)} == want
            assert {s.episode_id for s in pool.query_steps(f, limit=100)} == want
        assert pool.query_steps(StepFilter(metadata={"code_version": "cccccccccccc"}), limit=100) == []
    finally:
        pool.close()
