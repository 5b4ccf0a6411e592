"""The trust boundary on a real gateway over SQLite and PostgreSQL: every accepted input is storable,
white-box steps cannot poison training, episode routes need a key, pool reads need the token,
late rewards are kept as events, and a gateway off loopback does not start without tokens."""

from __future__ import annotations

import json
from typing import Any

import pytest

from swarm.gateway import GatewaySettings
from swarm.gateway.hostile import FORGE, nest, out_of_vocab_steps, unstorable_requests, whitebox
from swarm.policy.echo import EchoBackend
from swarm.pool import Pool, StepFilter
from swarm.stack import start_stack

ADMIN = {"Authorization": "Bearer adm"}


def test_unstorable_inputs_are_400_before_any_write(gw: Any) -> None:
    ep = gw.episode()
    key, eid = ep["api_key"], ep["episode_id"]
    cases = unstorable_requests(key, eid, admin="adm")
    for path, k, body in cases:
        r = gw.post(path, k, content=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        assert r.status_code == 400, (path, str(body)[:120], r.status_code, r.text[:300])
        assert r.json()["error"]["message"]
    # NaN nested in free-form JSON (Python's json accepts the literal; JSONB does not)
    r = gw.post("/v1/episodes", None, content=b'{"task": "t", "metadata": {"x": NaN}}',
                headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    for path in ("/v1/pool/steps?task=a%00b", "/v1/pool/episodes/ep%00x", f"/v1/pool/steps?max_length={2**31}",
                 f"/v1/pool/steps?current_version={2**40}&max_staleness=0"):
        r = gw.http.get(path, headers=ADMIN)
        assert r.status_code == 400, (path, r.text)
    assert gw.post("/v1/episodes/ep%00x/heartbeat", key).status_code == 400
    # nothing was stored, and every read still works for everyone
    assert gw.pool.count_steps() == 0 and len(gw.pool.query_episodes(StepFilter())) == 1
    assert gw.http.get("/v1/pool/episodes", headers=ADMIN).status_code == 200
    # the largest storable values are accepted and read back
    ok = gw.post("/v1/episodes", None, json={"task": "t" * 256, "group_id": "g" * 128, "metadata": nest(30)})
    assert ok.status_code == 200, ok.text
    r = gw.post("/v1/steps", ok.json()["api_key"], json=whitebox(policy_version=2**31 - 1, step_id="s" * 128))
    assert r.status_code == 200, r.text
    assert gw.http.get("/v1/pool/episodes", headers=ADMIN).status_code == 200
    assert gw.http.get("/v1/pool/steps", params={"with_tokens": "true"}, headers=ADMIN).json()["total"] == 1


def test_model_text_with_nul_is_stored_and_its_ids_stay_exact(gw: Any, hf_gateway: Any) -> None:
    """A byte-level tokenizer can sample the byte 0, and the client sends the reply back next turn:
    model text with NUL is accepted on both backends, stored as U+FFFD, and tokenized exactly."""
    ep = gw.episode()
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a\u0000b"}, {"role": "user", "content": "c"}]
    r = gw.chat(ep["api_key"], msgs, max_tokens=2)
    assert r.status_code == 200, r.text
    step = gw.pool.get_step(r.json()["swarm"]["step_id"])
    assert step.prompt_messages[1]["content"] == "a\ufffdb"
    r = gw.post("/v1/steps", ep["api_key"], json=whitebox(response_text="x\u0000", prompt_messages=msgs,
                                                            tool_calls=[{"function": {"arguments": "\u0000"}}]))
    assert r.status_code == 200, r.text
    (wb,) = [s for s in gw.pool.query_steps(StepFilter()) if s.source.value == "whitebox"]
    assert wb.response_text == "x\ufffd" and wb.tool_calls == [{"function": {"arguments": "\ufffd"}}]
    # the hf backend tokenizes the NUL byte itself, so the next turn's prompt extends the reply's ids
    ep = hf_gateway.episode()
    r = hf_gateway.chat(ep["api_key"], msgs, max_tokens=2)
    assert r.status_code == 200, r.text
    ids = hf_gateway.pool.get_step(r.json()["swarm"]["step_id"]).prompt_ids
    assert "a\u0000b" in hf_gateway.backend.decode("default", ids)


def test_whitebox_token_ids_outside_the_vocabulary_are_refused(gw: Any) -> None:
    key = gw.episode()["api_key"]
    vocab = gw.backend.vocab_size("default")
    for i, body in enumerate(out_of_vocab_steps(vocab)):  # the bad id in the response, then in the prompt
        r = gw.post("/v1/steps", key, json=body)
        assert r.status_code == 400, r.text
        assert i % 2 or r.json()["error"]["code"] == "invalid_token_id", r.text
    assert gw.pool.count_steps() == 0
    ok = gw.post("/v1/steps", key, json={"steps": [{"prompt_ids": [0], "response_ids": [vocab - 1]}]})
    assert ok.status_code == 200
    # a policy this gateway does not serve has no known vocabulary: stored, never trained here
    other = gw.post("/v1/steps", key, json={"steps": [{"prompt_ids": [0], "response_ids": [10**6], "policy": "x"}]})
    assert other.status_code == 200


def test_parent_step_must_be_in_the_same_episode(gw: Any) -> None:
    a, b = gw.episode(), gw.episode()
    sid = gw.post("/v1/steps", a["api_key"], json=whitebox()).json()["step_ids"][0]
    r = gw.post("/v1/steps", b["api_key"], json=whitebox(parent_step_id=sid))
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_parent"
    r = gw.post("/v1/steps", b["api_key"], json=whitebox(parent_step_id="step-nope"))
    assert r.status_code == 400
    assert gw.post("/v1/steps", a["api_key"], json=whitebox(parent_step_id=sid)).status_code == 200
    chain = {"steps": [{"step_id": "b-1", "prompt_ids": [1], "response_ids": [2]},
                       {"prompt_ids": [1, 2], "response_ids": [3], "parent_step_id": "b-1"}]}
    assert gw.post("/v1/steps", b["api_key"], json=chain).status_code == 200


def test_episode_routes_need_the_key_or_a_configured_token(make_gateway: Any) -> None:
    open_gw = make_gateway()  # no tokens at all: still no anonymous writes to an episode
    ep = open_gw.episode()
    eid, key = ep["episode_id"], ep["api_key"]
    sid = open_gw.post("/v1/steps", key, json=whitebox()).json()["step_ids"][0]
    for k in (None, "garbage", "sk-not-ours"):
        for path, body in ((f"/v1/episodes/{eid}/heartbeat", {}), (f"/v1/episodes/{eid}/end", {"reward": 1}),
                           (f"/v1/episodes/{eid}/abort", {}), ("/v1/feedback", {"step_id": sid, "reward": 5.0}),
                           ("/v1/events", {"kind": "reward", "episode_id": eid, "value": 5.0})):
            assert open_gw.post(path, k, json=body).status_code == 401, (k, path)
    assert open_gw.pool.get_episode(eid).status.value == "open"
    assert open_gw.post(f"/v1/episodes/{eid}/heartbeat", key).status_code == 200
    svc = make_gateway(client_token="cli", admin_token="adm")
    ep2 = svc.episode(token="cli")
    assert svc.post("/v1/feedback", "cli", json={"episode_id": ep2["episode_id"], "rating": 1}).status_code == 200
    assert svc.post(f"/v1/episodes/{ep2['episode_id']}/end", "adm", json={}).status_code == 200
    # pool reads: the admin token once one is set (a client token or an episode key is not enough)
    assert svc.http.get("/v1/pool/stats").status_code == 401
    assert svc.http.get("/v1/pool/stats", headers={"Authorization": "Bearer cli"}).status_code == 403
    assert svc.http.get("/v1/pool/steps", headers={"Authorization": f"Bearer {ep2['api_key']}"}).status_code == 403
    assert svc.http.get("/dashboard/api/steps").status_code == 401
    assert svc.http.get("/v1/pool/stats", headers=ADMIN).status_code == 200
    only_client = make_gateway(client_token="cli")
    assert only_client.http.get("/v1/pool/stats").status_code == 401
    assert only_client.http.get("/v1/pool/stats", headers={"Authorization": "Bearer cli"}).status_code == 200


def test_late_rewards_are_kept_as_events(gw: Any) -> None:
    ep = gw.episode()
    key, eid = ep["api_key"], ep["episode_id"]
    sid = gw.post("/v1/steps", key, json=whitebox()).json()["step_ids"][0]
    assert gw.post(f"/v1/episodes/{eid}/end", key, json={"reward": 1.0}).status_code == 200
    # the agent's own late reward never overwrites its final one: it stays as an event, and the answer says why
    r = gw.post("/v1/events", key, json={"kind": "reward", "episode_id": eid, "value": 7.0})
    assert r.status_code == 200 and r.json()["reward_applied"] is False and "final" in r.json()["reward_reason"]
    assert gw.pool.get_episode(eid).reward == 1.0
    step = gw.pool.get_step(sid, with_tokens=False)
    assert step.reward == 1.0 and step.reward_status.value == "final"
    # the admin's reward supersedes the agent's report (reward authority, tests/gateway/test_trust_round2.py)
    r = gw.post("/v1/feedback", "adm", json={"step_id": sid, "reward": -3.0, "rating": 1})
    assert r.status_code == 200 and r.json()["reward_applied"] is True
    assert gw.pool.get_step(sid, with_tokens=False).reward == -3.0
    history = [(e.kind, e.value) for e in gw.pool.events(episode_id=eid)]
    assert history == [("reward", 7.0), ("feedback", -3.0)]


def test_off_loopback_needs_both_tokens(tmp_path: Any) -> None:
    pool = Pool(f"sqlite:///{tmp_path / 'p.db'}")
    try:
        for settings in (GatewaySettings(), GatewaySettings(admin_token="a"), GatewaySettings(client_token="c")):
            with pytest.raises(ValueError, match="refusing to serve on 0.0.0.0"):
                start_stack(pool, EchoBackend(), settings, host="0.0.0.0")
        GatewaySettings(admin_token="a", client_token="c").check_bind("0.0.0.0")
        for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
            GatewaySettings().check_bind(host)
        summary = GatewaySettings().access_summary()
        assert "OPEN to anyone" in summary and "leases" in summary
        assert "OPEN" not in GatewaySettings(admin_token="a", client_token="c").access_summary()
    finally:
        pool.close()


def test_gateway_records_forged_content_as_text(hf_gateway: Any) -> None:
    ep = hf_gateway.episode()
    r = hf_gateway.chat(ep["api_key"], [{"role": "user", "content": FORGE}], max_tokens=2)
    assert r.status_code == 200, r.text
    step = hf_gateway.pool.get_step(r.json()["swarm"]["step_id"])
    tok = hf_gateway.backend.tokenizer
    start = tok.convert_tokens_to_ids("<|im_start|>")
    # the template's turns only: (system,) user, assistant generation prompt
    rendered = tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False, add_generation_prompt=True)
    assert step.prompt_ids.count(start) == rendered.count("<|im_start|>")
    assert FORGE in hf_gateway.backend.decode("default", step.prompt_ids)
