"""A correction posted to /v1/feedback is stored with its exact ids on the step's tokenizer, ended like an assistant turn."""

from __future__ import annotations

from typing import Any

from swarm.pool.feedback import CORRECTION_KEY


def test_correction_stores_exact_ids(hf_gateway: Any) -> None:
    gw, backend = hf_gateway, hf_gateway.backend
    ep = gw.episode()
    key, eid = ep["api_key"], ep["episode_id"]
    first = gw.chat(key, [{"role": "user", "content": "hello there"}], max_tokens=8).json()
    last = gw.chat(key, [{"role": "user", "content": "and then?"}], max_tokens=8).json()
    text = "the answer is <|im_end|> forty two"  # a control token's spelling is text, not the control id
    r = gw.post("/v1/feedback", key, json={"response_id": first["id"], "correction": text})
    assert r.status_code == 200, r.text
    body = r.json()
    eot = backend.tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = body["correction_ids"]
    assert body["correction_step_id"] == first["swarm"]["step_id"]
    assert ids[-1] == eot and eot not in ids[:-1]
    assert backend.decode("default", ids) == text + "<|im_end|>"
    plain = backend.encode("default", "the answer is ")
    assert ids[:len(plain)] == plain
    step = gw.pool.get_step(body["correction_step_id"])
    if step.finish_reason == "stop":  # a generated turn ends with the same id
        assert step.response_ids[-1] == eot
    (fb,) = [e for e in gw.pool.events(episode_id=eid) if e.kind == "feedback"]
    assert fb.correction == text
    assert fb.payload[CORRECTION_KEY] == {"step_id": step.step_id, "policy": "default", "ids": ids}
    # an episode's correction corrects its last step
    r = gw.post("/v1/feedback", key, json={"episode_id": eid, "correction": "ok"})
    assert r.status_code == 200 and r.json()["correction_step_id"] == last["swarm"]["step_id"]
    assert r.json()["correction_ids"] == backend.encode("default", "ok") + [eot]
    (c1, c2) = gw.pool.pending_corrections("default", max_uses=1, limit=8)
    assert (c1.response_ids, c2.step_id) == (tuple(ids), last["swarm"]["step_id"])
    # the key is the gateway's: a client cannot forge ids
    r = gw.post("/v1/feedback", key, json={"episode_id": eid, "rating": 1, "payload": {CORRECTION_KEY: {"ids": [1]}}})
    assert r.status_code == 400 and CORRECTION_KEY in r.json()["error"]["message"]


def test_correction_without_a_tokenizer_is_text_only(gateway: Any) -> None:
    """The echo backend serves no local HF tokenizer: the correction is kept as text, with the reason."""
    ep = gateway.episode()
    gateway.chat(ep["api_key"], [{"role": "user", "content": "a"}])
    r = gateway.post("/v1/feedback", ep["api_key"], json={"episode_id": ep["episode_id"], "correction": "b"})
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["correction_ids"] is None and "end-of-turn" in got["correction_reason"]
    assert gateway.pool.events(episode_id=ep["episode_id"])[0].correction == "b"
