"""A correction posted through the real gateway during a real training run moves the model's reply to that prompt toward it."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from flow_waits import health, wait_for

from flows.train import train_flow
from swarm.pool import Pool, StepFilter
from swarm.stack import free_port

pytestmark = pytest.mark.usefixtures("prefect_harness")

UPDATES = 12  # the correction arrives after the first step: a late one (a loaded machine) still trains for 6+ updates
CORRECTION = "piano lemon candle"  # not the echo task's answer: GRPO alone does not push toward it
CONTROL = "river stone cloud"  # never posted: how far the run moves an uncorrected reply of the same shape


def _first_step(url: str) -> Any:
    pool = Pool(url)
    try:
        got = pool.query_steps(StepFilter(policy="default"), limit=1, with_tokens=True)
        return got[0] if got else None
    finally:
        pool.close()


def _score(model: Any, prompt: list[int], target: list[int]) -> tuple[float, int, int]:
    """Of ``target`` after ``prompt``: the summed logprob, the tokens that are the argmax given the target's own
    prefix (teacher-forced), and the tokens free-running greedy decoding reproduces before it first differs."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + target])).logits[0, len(prompt) - 1:-1].float()
        lp = logits.log_softmax(-1).gather(1, torch.tensor(target)[:, None]).sum().item()
        forced = int((logits.argmax(-1) == torch.tensor(target)).sum())
        ids = torch.tensor([prompt])
        for _ in range(len(target)):
            nxt = model(ids).logits[0, -1].argmax()
            ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
    greedy = ids[0, len(prompt):].tolist()
    same = next((i for i, (a, b) in enumerate(zip(greedy, target, strict=True)) if a != b), len(target))
    return lp, forced, same


@pytest.mark.slow
def test_correction_trains_toward_its_text(flow_config, tmp_path: Path, monkeypatch, warm_tiny_model_path) -> None:
    monkeypatch.setenv("SWARM_ADMIN_TOKEN", "adm")  # the test posts feedback on a worker's step as the admin
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cfg = flow_config(f"gateway.port={port}", f"train.updates={UPDATES}", "task.group_size=4", "batching.min_groups=2",
                      "train.batch_timeout_s=120", f"feedback.correction_updates={UPDATES}",
                      "feedback.correction_weight=4")
    result: dict[str, Any] = {}
    flow = threading.Thread(target=lambda: result.update(train_flow(cfg)), daemon=True)
    flow.start()
    wait_for(lambda: health(url), 90, "the gateway", flow)
    step = wait_for(lambda: _first_step(cfg["pool"]["url"]), 90, "a recorded step", flow)
    r = httpx.post(f"{url}/v1/feedback", headers={"Authorization": "Bearer adm"}, timeout=30,
                   json={"step_id": step.step_id, "correction": CORRECTION, "rating": 1.0})
    assert r.status_code == 200, r.text
    ids, event_id = r.json()["correction_ids"], r.json()["event_id"]
    assert ids
    flow.join(240)
    assert not flow.is_alive(), "the run did not finish"
    assert result["status"] == "FINISHED" and result["updates"] == UPDATES

    pool = Pool(cfg["pool"]["url"])
    try:
        used = pool.feedback_uses([event_id]).get(event_id, [])
        assert 2 <= len(used) <= UPDATES and used == sorted(set(used)), used  # at most correction_updates times
        assert pool.pending_corrections("default", max_uses=UPDATES) == [] or len(used) < UPDATES
    finally:
        pool.close()

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(warm_tiny_model_path)).eval()
    from swarm.policy.hf import HFBackend

    backend = HFBackend(str(warm_tiny_model_path), torch_threads=1)
    try:
        control = backend.encode("default", CONTROL) + [ids[-1]]
    finally:
        backend.close()
    prompt = list(step.prompt_ids)
    base = AutoModelForCausalLM.from_pretrained(str(warm_tiny_model_path)).eval()
    before, control_before = _score(base, prompt, ids), _score(base, prompt, control)
    adapters = sorted((Path(cfg["train"]["out_dir"]) / "adapters" / "default").iterdir())
    trained = PeftModel.from_pretrained(base, str(adapters[-1])).eval()
    after, control_after = _score(trained, prompt, ids), _score(trained, prompt, control)
    print(f"correction logprob {before[0]:.2f} -> {after[0]:.2f} (control {control_before[0]:.2f} -> "
          f"{control_after[0]:.2f}); argmax tokens {before[1]} -> {after[1]}, greedy prefix {before[2]} -> {after[2]} "
          f"of {len(ids)}; trained by versions {used}")
    assert after[0] - before[0] > 10.0 + (control_after[0] - control_before[0]), (before, after)
    # more of the correction's tokens become the model's first choice (3 -> 6..8 of 8 over runs: the updates that
    # include it depend on when it arrives, and torch's thread count changes the sampled batches)
    assert after[1] >= before[1] + 2 and after[2] >= before[2], (before, after)
