"""Drive real traffic through a running gateway so every dashboard view has data.

Black-box episodes through the OpenAI SDK (multi-turn, so later turns are prefix-consistent
extensions of earlier ones), white-box steps, a failed and a still-open episode, late service
feedback, then two training rounds the way a trainer does them over HTTP: lease -> ack, with
a published policy version in between (the backend's version goes up, so later steps carry it).
"""

from __future__ import annotations

from typing import Any

import httpx

from swarm.client import SwarmClient
from swarm.records import PolicyVersion

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
