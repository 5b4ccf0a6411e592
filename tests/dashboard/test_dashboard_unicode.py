"""The dashboard's step views over a row with invalid Unicode already stored: 200, the bad text escaped
and named under ``unreadable``, every other row served as stored (issue 35, item 1's read-side repair)."""

from __future__ import annotations

from pathlib import Path

import httpx

from swarm.app import GatewaySettings, create_app
from swarm.policy.echo import EchoBackend
from swarm.pool import Pool
from swarm.records import Episode, Step
from swarm.stack import ServerThread


def test_step_views_serve_a_row_with_a_lone_surrogate(tmp_path: Path) -> None:
    # SQLite stores what the gateway now refuses: written past it, as rows from before the check were
    pool = Pool(f"sqlite:///{tmp_path / 'pool.db'}")
    bad_ep = pool.add_episode(Episode(task="t", metadata={"role": "wolf\ud800", "m": "x\udfff"}))
    good_ep = pool.add_episode(Episode(task="t", metadata={"role": "seer"}))
    bad_id, sibling_id = pool.add_steps([
        Step(episode_id=bad_ep.episode_id, prompt_ids=[1], response_ids=[2], response_text="r\ud800",
             prompt_messages=[{"role": "user", "content": "\udfff"}]),
        Step(episode_id=bad_ep.episode_id, prompt_ids=[1, 2], response_ids=[3], response_text="fine")])
    (good_id,) = pool.add_steps([Step(episode_id=good_ep.episode_id, prompt_ids=[1], response_ids=[4],
                                   response_text="ok")])
    server = ServerThread(create_app(pool, EchoBackend(max_context=4096), GatewaySettings(admin_token="adm"))).start()
    try:
        with httpx.Client(base_url=server.url, timeout=60, headers={"Authorization": "Bearer adm"}) as http:
            r = http.get("/dashboard/api/steps")
            assert r.status_code == 200, r.text
            page = r.json()
            assert {s["step_id"] for s in page["data"]} == {bad_id, sibling_id, good_id}
            # the role comes from the episode's metadata: escaped on both of that episode's rows
            assert sorted(n["step_id"] for n in page["unreadable"]) == sorted([bad_id, sibling_id])
            assert all(n["fields"] == ["role"] for n in page["unreadable"])
            rows = {s["step_id"]: s for s in page["data"]}
            assert rows[bad_id]["role"] == "wolf\\ud800" and rows[good_id]["role"] == "seer"

            r = http.get(f"/dashboard/api/steps/{bad_id}")
            assert r.status_code == 200, r.text
            d = r.json()
            assert d["response_text"] == "r\\ud800" and d["prompt_messages"][0]["content"] == "\\udfff"
            assert d["episode"]["metadata"]["m"] == "x\\udfff" and len(d["episode_steps"]) == 2
            (note,) = d["unreadable"]
            assert note["step_id"] == bad_id
            assert {"response_text", "prompt_messages.0.content", "episode.metadata.role",
                    "episode.metadata.m"} <= set(note["fields"])
            assert d["tokens_view"]["response"] == [2]

            r = http.get(f"/dashboard/api/steps/{good_id}")  # a clean row: served as before, nothing named
            assert r.status_code == 200 and "unreadable" not in r.json() and r.json()["response_text"] == "ok"
            for path in ("/dashboard/api/collection", "/dashboard/api/consumption", "/dashboard/api/curation"):
                assert http.get(path).status_code == 200, path
    finally:
        server.stop()
        pool.close()
