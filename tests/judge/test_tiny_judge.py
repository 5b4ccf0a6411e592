"""The tiny local model as judge through a real gateway: constrained decoding makes its reply fit the schema."""

from __future__ import annotations

from pathlib import Path

from swarm.app import GatewaySettings, create_app
from swarm.client import SwarmClient
from swarm.judge import GroupJudge, JudgeSpec
from swarm.policy.hf import HFBackend
from swarm.pool import Pool, StepFilter
from swarm.stack import ServerThread


def test_tiny_judge_answers_in_schema_first_time(tmp_path: Path, tiny_model_path: Path) -> None:
    backend = HFBackend(str(tiny_model_path), torch_threads=1)
    pool = Pool(f"sqlite:///{tmp_path / 'pool.db'}")
    server = ServerThread(create_app(pool, backend, GatewaySettings(reward_authority={"t": "judge"}))).start()
    try:
        with SwarmClient(server.url) as client:
            for word in ("apple", "river", "stone", "cloud"):
                ep = client.begin("t", group_id="t-0")
                ep.openai(max_retries=0).chat.completions.create(
                    model="default", messages=[{"role": "user", "content": f"say {word}"}], max_tokens=6)
                ep.end(reward=1.0)
        judge = GroupJudge(pool, server.url, JudgeSpec(policy="default", retries=0), "t", group_size=4)
        [out] = judge.poll()
        judge.close()
        assert out.status == "judged" and judge.stats["bad_replies"] == 0 and len(out.rewards) == 4
        assert all(0.0 <= r <= 1.0 for r in out.rewards.values())
        [step] = pool.query_steps(StepFilter(episode_id=out.judge_episodes[0], include_excluded=True), limit=5)
        assert step.metadata["constraint"]["kind"] == "json_schema"  # sampled under the schema's grammar
        assert step.response_text.startswith('{"t1":')
    finally:
        server.stop()
        pool.close()
        backend.close()
