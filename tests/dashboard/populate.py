"""Drive real traffic through a running gateway so every dashboard view has data; and a finished
multi-agent run with known numbers (:func:`finished_game_run`).

Black-box episodes through the OpenAI SDK (multi-turn, so later turns are prefix-consistent
extensions of earlier ones), white-box steps, a failed and a still-open episode, late service
feedback, then two training rounds the way a trainer does them over HTTP: lease -> ack, with
a published policy version in between (the backend's version goes up, so later steps carry it).
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from swarm.client import SwarmClient
from swarm.records import Episode, EpisodeStatus, PolicyVersion, Step

ADMIN = "dash-admin-token"  # the admin token of the dashboard tests' gateway
WORDS = ("apple", "river", "stone", "cloud", "amber", "maple", "tiger", "ocean")


def _chat(ep: Any, word: str, turns: int) -> None:
    client = ep.openai(max_retries=0)
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "Repeat the last word you are given."},
                                  {"role": "user", "content": f"say {word}"}]
    for t in range(turns):
        r = client.chat.completions.create(model="default", messages=msgs, max_tokens=12, logprobs=True)
        msgs += [{"role": "assistant", "content": r.choices[0].message.content},
                 {"role": "user", "content": f"again: {WORDS[(t + 3) % len(WORDS)]}"}]


def run_groups(url: str, round_: int, groups: int = 3, group_size: int = 4, turns: int = 2) -> None:
    """``groups`` prompt groups of ``group_size`` episodes, rewards varying inside each group."""
    with SwarmClient(url, retries=2) as sc:
        for g in range(groups):
            word = WORDS[(g + 2 * round_) % len(WORDS)]
            for k in range(group_size):
                cid = f"worker-{'ab'[k % 2]}"
                with sc.episode(task="echo-demo", group_id=f"echo-{round_}-{g}", client_id=cid) as ep:
                    _chat(ep, word, turns)
                    ep.end(reward=float(k % 2) * (0.5 + 0.1 * round_ + 0.1 * g), correct=k % 2)


def extras(url: str) -> dict[str, str]:
    """A white-box episode, a failed one, an open one, feedback; returns their ids."""
    with SwarmClient(url, retries=2) as sc:
        wb = sc.begin(task="whitebox-demo", client_id="agent-wb")
        r = sc.request("POST", "/v1/steps", key=wb.api_key, json={"steps": [
            {"prompt_ids": [1, 2, 3, 4, 5, 6], "response_ids": [7, 8, 9], "response_logprobs": [-0.1, -2.3, -0.7],
             "policy": "default", "response_text": "789"}]})
        wb.end(reward=1.0)
        failed = sc.begin(task="echo-demo", client_id="worker-c")
        _chat(failed, "broken", 1)
        failed.abort()
        still = sc.begin(task="math-demo", client_id="worker-c", timeout_s=3600)
        _chat(still, "open", 1)
        sc.request("POST", "/v1/feedback", key=wb.api_key,
                   json={"episode_id": wb.episode_id, "rating": 0.9, "correction": "fine"})
    return {"whitebox_episode": wb.episode_id, "whitebox_step": r["step_ids"][0], "open_episode": still.episode_id}


def train_round(url: str, pool: Any, backend: Any, version: int, headers: dict[str, str] | None = None) -> dict:
    """What a trainer does over HTTP: lease trainable groups, (train), publish, ack."""
    with httpx.Client(base_url=url, timeout=30, headers=headers or {}) as h:
        r = h.post("/v1/pool/leases", json={"filter": {"policy": "default", "reward_status": "final",
                                                          "episode_status": "finished", "episode_type": "train",
                                                          "consumed": False}, "max_groups": 2, "ttl_s": 300})
        r.raise_for_status()
        lease = r.json()
        backend.load_weights("default", {}, version)
        pool.add_policy_version(PolicyVersion(policy="default", version=version))
        h.post(f"/v1/pool/leases/{lease['lease_id']}/ack", json={"consumed_version": version}).raise_for_status()
    return lease


def populate(url: str, pool: Any, backend: Any, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """The full scenario; returns ids the tests look for."""
    run_groups(url, 0)
    leases = [train_round(url, pool, backend, 1, headers)]
    run_groups(url, 1)
    leases.append(train_round(url, pool, backend, 2, headers))
    run_groups(url, 2, groups=2)
    ids = extras(url)
    ids["leases"] = [ls["lease_id"] for ls in leases]
    return ids


# A finished multi-agent run, written straight into a pool with past timestamps: werewolves-like
# games (one episode per seat, role and seat in the episode's metadata, two policies), where
# some seats were played across a policy update. ``(policy, role, seat, type, versions of its
# steps, reward, status)``; rewards are chosen so that step-weighted and episode means differ.
GAME_SEATS = (
    ("default", "villager", 1, "train", (0, 0), 1.0, "finished"),
    ("default", "seer", 2, "train", (0, 0), 0.0, "finished"),
    ("default", "villager", 4, "train", (0, 1), -1.0, "finished"),  # spans the update: not attributed
    ("default", "villager", 5, "train", (1, 1, 1), 0.5, "finished"),
    ("default", "seer", 2, "train", (1,), -0.5, "finished"),
    ("default", "villager", 3, "eval", (1,), 1.0, "finished"),
    ("default", "villager", 6, "train", (1,), None, "open"),  # no reward yet: not counted
    ("default", "seer", 7, "train", (2,), None, "failed"),  # failed: not counted
    ("wolf", "werewolf", 0, "train", (0,), -1.0, "finished"),
    ("wolf", "werewolf", 8, "train", (0, 1), 1.0, "finished"),  # spans the update: not attributed
    ("wolf", "werewolf", 0, "train", (1,), 1.0, "finished"),
)
# what the dashboard must show for GAME_SEATS: (policy, version) -> {type: (episodes, mean reward)}
GAME_EPISODE_REWARDS = {("default", 0): {"train": (2, 0.5)}, ("default", 1): {"eval": (1, 1.0), "train": (2, 0.0)},
                        ("wolf", 0): {"train": (1, -1.0)}, ("wolf", 1): {"train": (1, 1.0)}}
GAME_MIXED = {"default": 1, "wolf": 1}
# the old, step-weighted attribution, for contrast: (1+1+0+0-1) / 5 and (-1+0.5*3-0.5+1) / 6
GAME_STEP_MEANS = {("default", 0): 0.2, ("default", 1): 1 / 6}


def finished_game_run(pool: Any, hours_ago: float = 3.0, span_s: float = 240.0) -> dict[str, Any]:
    """Write GAME_SEATS into ``pool`` as a run that ended ``hours_ago`` hours ago over ``span_s`` s."""
    t0 = time.time() - hours_ago * 3600
    n_steps = sum(len(s[4]) for s in GAME_SEATS)
    k, episodes = 0, []
    for i, (policy, role, seat, typ, versions, reward, status) in enumerate(GAME_SEATS):
        t = t0 + span_s * k / n_steps
        ep = pool.add_episode(Episode(task="werewolves", group_id=f"game-{i // 4}", client_id="ww-worker", type=typ,
                                      created_at=t, updated_at=t,
                                      metadata={"role": role, "player": seat, "seed": i // 4, "policy": policy}))
        steps = []
        for j, v in enumerate(versions):
            steps.append(Step(episode_id=ep.episode_id, index=j, policy=policy, policy_version=v,
                              prompt_ids=[1, 2, 3, 10 + seat, 20 + j], response_ids=[30 + j, 31],
                              response_logprobs=[-0.2, -0.1], response_text="{}",
                              created_at=t0 + span_s * k / n_steps))
            k += 1
        pool.add_steps(steps)
        if status == "finished":
            pool.end_episode(ep.episode_id, reward=reward)
        elif status == "failed":
            pool.end_episode(ep.episode_id, status=EpisodeStatus.failed)
        episodes.append(ep.episode_id)
    return {"episodes": episodes, "steps": n_steps, "t_end": t0 + span_s * (n_steps - 1) / n_steps}
