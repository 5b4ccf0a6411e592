"""EpisodeSet: a game's episodes begun together, heartbeated together, and the open ones aborted when the game fails."""

from __future__ import annotations

import json

import httpx
import pytest

from swarm.client import EpisodeSet, SwarmClient


def gateway(calls: list[str], fail_abort: bool = False) -> SwarmClient:
    def answer(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        calls.append(path)
        if path == "/v1/episodes":
            n = sum(c == "/v1/episodes" for c in calls)
            return httpx.Response(200, json={"episode_id": f"ep{n}", "base_url": "http://gw/v1", "api_key": f"k{n}"})
        if path.endswith("/abort") and fail_abort:
            return httpx.Response(500, json={"error": {"type": "server_error", "message": "down"}})
        return httpx.Response(200, json={})

    return SwarmClient("http://gw", transport=httpx.MockTransport(answer), retries=0)


def test_a_failing_game_aborts_the_open_episodes_and_reraises() -> None:
    calls: list[str] = []
    with pytest.raises(RuntimeError, match="game broke"), EpisodeSet(gateway(calls)) as seats:
        seats.begin(0, task="g", group_id="g-1")
        seats.begin(1, task="g", group_id="g-1").end(reward=1.0)
        raise RuntimeError("game broke")
    assert calls == ["/v1/episodes", "/v1/episodes", "/v1/episodes/ep2/end", "/v1/episodes/ep1/abort"]
    assert all(ep.ended for _, ep in seats.items()) and list(seats) == [0, 1] and 1 in seats and len(seats) == 2


def test_a_failing_abort_does_not_hide_the_games_error() -> None:
    calls: list[str] = []
    with pytest.raises(KeyError), EpisodeSet(gateway(calls, fail_abort=True)) as seats:
        seats.begin("a", task="g")
        seats.begin("b", task="g")
        raise KeyError("x")
    assert calls[-2:] == ["/v1/episodes/ep1/abort", "/v1/episodes/ep2/abort"]  # the second is still tried


def test_heartbeats_are_throttled_and_a_clean_game_ends_nothing_itself() -> None:
    calls: list[str] = []
    with EpisodeSet(gateway(calls), heartbeat_s=0.0) as seats:
        seats.begin(0, task="g", metadata={"player": 0})
        seats.heartbeat()
        seats[0].end(reward=0.5)
        seats.heartbeat()  # an ended episode gets none
    assert calls == ["/v1/episodes", "/v1/episodes/ep1/heartbeat", "/v1/episodes/ep1/end"]
    with EpisodeSet(gateway(calls := []), heartbeat_s=3600) as seats:
        seats.begin(0, task="g")
        seats.heartbeat()
    assert calls == ["/v1/episodes"]  # not due yet; and leaving cleanly aborts nothing


def test_begin_passes_the_episode_fields_on() -> None:
    bodies: list[dict] = []

    def answer(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json={"episode_id": "e", "base_url": "http://gw/v1", "api_key": "k"})

    with EpisodeSet(SwarmClient("http://gw", transport=httpx.MockTransport(answer))) as seats:
        seats.begin(3, task="werewolves", group_id="w-1", type="eval", metadata={"seat": 3}).end()
    assert bodies[0]["task"] == "werewolves" and bodies[0]["type"] == "eval" and bodies[0]["metadata"] == {"seat": 3}
