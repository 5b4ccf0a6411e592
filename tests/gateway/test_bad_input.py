"""Bad input table: every malformed, forbidden or absurd request gets a 4xx in OpenAI's error shape
and leaves the pool exactly as it was."""

from __future__ import annotations

import json
from typing import Any

from swarm.policy.echo import EchoBackend


def snapshot(pool: Any) -> str:
    steps = [s.model_dump(mode="json") for s in pool.query_steps(limit=10_000, with_tokens=True)]
    eps = [e.model_dump(mode="json") for e in pool.query_episodes(limit=10_000)]
    events = [ev.model_dump(mode="json") for e in eps for ev in pool.events(episode_id=e["episode_id"])]
    return json.dumps([steps, eps, events], sort_keys=True)


def test_bad_inputs_get_4xx_and_change_nothing(make_gateway: Any) -> None:
    gw = make_gateway(EchoBackend(max_context=4096), max_body_bytes=256 * 1024, admin_token="adm-secret")
    ep, other, ended = gw.episode(), gw.episode(), gw.episode()
    key, okey, ekey = ep["api_key"], other["api_key"], ended["api_key"]
    assert gw.chat(key, [{"role": "user", "content": "hi"}]).status_code == 200
    step_id = gw.chat(okey, [{"role": "user", "content": "hi"}]).json()["swarm"]["step_id"]
    assert gw.post(f"/v1/episodes/{ended['episode_id']}/end", ekey, json={"reward": 1.0}).status_code == 200
    tampered = key[:-4] + ("AAAA" if not key.endswith("AAAA") else "BBBB")
    user = [{"role": "user", "content": "hi"}]
    chat = "/v1/chat/completions"
    J = {"Content-Type": "application/json"}
    # (what, method, path, key, kwargs, expected status, expected code or None)
    cases: list[tuple[str, str, str, str | None, dict[str, Any], int, str | None]] = [
        ("malformed json", "POST", chat, key, {"content": b'{"model": "default", "mess', "headers": J}, 400, "invalid_json"),
        ("json array body", "POST", chat, key, {"json": [1, 2]}, 400, "invalid_json"),
        ("empty body", "POST", chat, key, {"content": b"", "headers": J}, 400, None),
        ("missing messages", "POST", chat, key, {"json": {"model": "default"}}, 400, None),
        ("messages not a list", "POST", chat, key, {"json": {"model": "default", "messages": "hi"}}, 400, None),
        ("no messages", "POST", chat, key, {"json": {"model": "default", "messages": []}}, 400, None),
        ("bad role", "POST", chat, key, {"json": {"model": "default", "messages": [{"role": "robot", "content": "x"}]}}, 400, None),
        ("content wrong type", "POST", chat, key, {"json": {"model": "default", "messages": [{"role": "user", "content": 5}]}}, 400, None),
        ("image part", "POST", chat, key, {"json": {"model": "default", "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:,"}}]}]}}, 400, "unsupported_content"),
        ("temperature text", "POST", chat, key, {"json": {"model": "default", "messages": user, "temperature": "hot"}}, 400, None),
        ("temperature 5", "POST", chat, key, {"json": {"model": "default", "messages": user, "temperature": 5}}, 400, None),
        ("unknown key NaN", "POST", chat, key, {"content": b'{"model":"default","messages":[{"role":"user","content":"x"}],"colour":NaN}', "headers": J}, 400, "invalid_value"),
        ("temperature NaN", "POST", chat, key, {"content": b'{"model":"default","messages":[{"role":"user","content":"x"}],"temperature":NaN}', "headers": J}, 400, None),
        ("top_p Infinity", "POST", chat, key, {"content": b'{"model":"default","messages":[{"role":"user","content":"x"}],"top_p":Infinity}', "headers": J}, 400, None),
        ("n zero", "POST", chat, key, {"json": {"model": "default", "messages": user, "n": 0}}, 400, None),
        ("n huge", "POST", chat, key, {"json": {"model": "default", "messages": user, "n": 1000}}, 400, None),
        ("max_tokens negative", "POST", chat, key, {"json": {"model": "default", "messages": user, "max_tokens": -1}}, 400, None),
        ("max_tokens absurd", "POST", chat, key, {"json": {"model": "default", "messages": user, "max_tokens": 10**12}}, 400, None),
        ("max_completion_tokens absurd", "POST", chat, key, {"json": {"model": "default", "messages": user, "max_completion_tokens": 999_999}}, 400, None),
        ("max_tokens string", "POST", chat, key, {"json": {"model": "default", "messages": user, "max_tokens": "many"}}, 400, None),
        ("top_logprobs 50", "POST", chat, key, {"json": {"model": "default", "messages": user, "logprobs": True, "top_logprobs": 50}}, 400, None),
        ("stop as int", "POST", chat, key, {"json": {"model": "default", "messages": user, "stop": 3}}, 400, None),
        ("tool without function", "POST", chat, key, {"json": {"model": "default", "messages": user, "tools": [{"type": "function"}]}}, 400, None),
        ("stream not bool", "POST", chat, key, {"json": {"model": "default", "messages": user, "stream": "yes please"}}, 400, None),
        ("unknown model", "POST", chat, key, {"json": {"model": "gpt-9", "messages": user}}, 404, "model_not_found"),
        ("context too long", "POST", chat, key, {"json": {"model": "default", "messages": [{"role": "user", "content": "x" * 5000}]}}, 400, "context_length_exceeded"),
        ("prompt + max_tokens too long", "POST", chat, key, {"json": {"model": "default", "messages": [{"role": "user", "content": "x" * 3000}], "max_tokens": 2000}}, 400, "context_length_exceeded"),
        ("oversized body", "POST", chat, key, {"json": {"model": "default", "messages": [{"role": "user", "content": "x" * 300_000}]}}, 413, None),
        ("oversized chunked body", "POST", chat, key, {"content": iter([b"{" + b" " * 200_000, b" " * 200_000 + b"}"]), "headers": J}, 413, None),
        ("no key", "POST", chat, None, {"json": {"model": "default", "messages": user}}, 401, "missing_api_key"),
        ("not a swarm key", "POST", chat, "sk-openai-123", {"json": {"model": "default", "messages": user}}, 401, "invalid_api_key"),
        ("forged key", "POST", chat, "sk-swarm-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", {"json": {"model": "default", "messages": user}}, 401, "invalid_api_key"),
        ("tampered key", "POST", chat, tampered, {"json": {"model": "default", "messages": user}}, 401, "invalid_api_key"),
        ("garbage key", "POST", chat, "sk-swarm-!!!", {"json": {"model": "default", "messages": user}}, 401, "invalid_api_key"),
        ("basic auth", "POST", chat, None, {"json": {"model": "default", "messages": user}, "headers": {"Authorization": "Basic eDp5"}}, 401, "invalid_api_key"),
        ("ended episode key", "POST", chat, ekey, {"json": {"model": "default", "messages": user}}, 403, "episode_ended"),
        ("ended episode completions", "POST", "/v1/completions", ekey, {"json": {"model": "default", "prompt": "x"}}, 403, "episode_ended"),
        ("completions batch", "POST", "/v1/completions", key, {"json": {"model": "default", "prompt": ["a", "b"]}}, 400, None),
        ("completions echo", "POST", "/v1/completions", key, {"json": {"model": "default", "prompt": "a", "echo": True}}, 400, None),
        ("completions negative id", "POST", "/v1/completions", key, {"json": {"model": "default", "prompt": [1, -2]}}, 400, None),
        ("episode without task", "POST", "/v1/episodes", None, {"json": {}}, 400, None),
        ("episode negative timeout", "POST", "/v1/episodes", None, {"json": {"task": "t", "timeout_s": -1}}, 400, None),
        ("episode bad type", "POST", "/v1/episodes", None, {"json": {"task": "t", "type": "play"}}, 400, None),
        ("episode unknown field", "POST", "/v1/episodes", None, {"json": {"task": "t", "colour": "red"}}, 400, None),
        ("end NaN reward", "POST", f"/v1/episodes/{ep['episode_id']}/end", key, {"content": b'{"reward": NaN}', "headers": J}, 400, None),
        ("end string reward", "POST", f"/v1/episodes/{ep['episode_id']}/end", key, {"json": {"reward": "good"}}, 400, None),
        ("end bad status", "POST", f"/v1/episodes/{ep['episode_id']}/end", key, {"json": {"status": "open"}}, 400, None),
        ("end unknown step reward", "POST", f"/v1/episodes/{ep['episode_id']}/end", key, {"json": {"reward": 1, "step_rewards": {"step-nope": 1}}}, 404, None),
        ("end other episode", "POST", f"/v1/episodes/{other['episode_id']}/end", key, {"json": {}}, 403, "wrong_episode"),
        ("heartbeat other episode", "POST", f"/v1/episodes/{other['episode_id']}/heartbeat", key, {}, 403, "wrong_episode"),
        ("end twice", "POST", f"/v1/episodes/{ended['episode_id']}/end", ekey, {"json": {}}, 409, None),
        ("abort ended", "POST", f"/v1/episodes/{ended['episode_id']}/abort", ekey, {}, 409, None),
        ("steps logprob length", "POST", "/v1/steps", key, {"json": {"steps": [{"prompt_ids": [1], "response_ids": [2, 3], "response_logprobs": [-0.1]}]}}, 400, None),
        ("steps positive logprob", "POST", "/v1/steps", key, {"json": {"steps": [{"prompt_ids": [1], "response_ids": [2], "response_logprobs": [0.5]}]}}, 400, None),
        ("steps negative id", "POST", "/v1/steps", key, {"json": {"steps": [{"prompt_ids": [-1], "response_ids": [2]}]}}, 400, None),
        ("steps huge id", "POST", "/v1/steps", key, {"json": {"steps": [{"prompt_ids": [2**40], "response_ids": [2]}]}}, 400, None),
        ("steps NaN reward", "POST", "/v1/steps", key, {"content": b'{"steps":[{"prompt_ids":[1],"response_ids":[2],"reward":NaN}]}', "headers": J}, 400, None),
        ("steps none", "POST", "/v1/steps", key, {"json": {"steps": []}}, 400, None),
        ("steps other episode", "POST", "/v1/steps", key, {"json": {"steps": [{"episode_id": other["episode_id"], "prompt_ids": [1], "response_ids": [2]}]}}, 403, "wrong_episode"),
        ("steps ended episode", "POST", "/v1/steps", ekey, {"json": {"steps": [{"prompt_ids": [1], "response_ids": [2]}]}}, 403, "episode_ended"),
        ("steps second bad", "POST", "/v1/steps", key, {"json": {"steps": [{"prompt_ids": [1], "response_ids": [2]}, {"prompt_ids": [1], "response_ids": "x"}]}}, 400, None),
        ("event no target", "POST", "/v1/events", key, {"json": {"name": "x"}}, 400, "missing_target"),
        ("event reward no value", "POST", "/v1/events", key, {"json": {"kind": "reward", "episode_id": ep["episode_id"]}}, 400, None),
        ("event reward NaN", "POST", "/v1/events", key, {"content": json.dumps({"kind": "reward", "episode_id": ep["episode_id"], "value": float("nan")}).encode(), "headers": J}, 400, None),
        ("event other episode", "POST", "/v1/events", key, {"json": {"episode_id": other["episode_id"], "name": "x"}}, 403, "wrong_episode"),
        ("event other's step", "POST", "/v1/events", key, {"json": {"step_id": step_id, "name": "x"}}, 403, "wrong_episode"),
        ("event unknown step", "POST", "/v1/events", key, {"json": {"step_id": "step-nope", "name": "x"}}, 404, None),
        ("event unknown response id", "POST", "/v1/events", key, {"json": {"response_id": "chatcmpl-nope", "name": "x"}}, 404, None),
        ("feedback empty", "POST", "/v1/feedback", key, {"json": {"episode_id": ep["episode_id"]}}, 400, "empty_feedback"),
        ("feedback inf rating", "POST", "/v1/feedback", key, {"content": b'{"episode_id": "x", "rating": Infinity}', "headers": J}, 400, None),
        ("pool unknown filter key", "GET", "/v1/pool/steps?colour=red", "adm-secret", {}, 400, None),
        ("pool bad enum", "GET", "/v1/pool/steps?source=robot", "adm-secret", {}, 400, None),
        ("pool negative limit", "GET", "/v1/pool/steps?limit=-1", "adm-secret", {}, 400, None),
        ("pool limit text", "GET", "/v1/pool/steps?limit=lots", "adm-secret", {}, 400, None),
        ("pool staleness without version", "GET", "/v1/pool/steps?max_staleness=1", "adm-secret", {}, 400, None),
        ("pool since NaN", "GET", "/v1/pool/steps?since=nan", "adm-secret", {}, 400, None),
        ("pool metadata not json", "GET", "/v1/pool/steps?metadata={x", "adm-secret", {}, 400, None),
        ("pool repeated key", "GET", "/v1/pool/steps?task=a&task=b", "adm-secret", {}, 400, None),
        ("pool unknown step", "GET", "/v1/pool/steps/step-nope", "adm-secret", {}, 404, None),
        ("pool unknown episode", "GET", "/v1/pool/episodes/ep-nope", "adm-secret", {}, 404, None),
        ("pool read without token", "GET", "/v1/pool/steps", None, {}, 401, "read_token_required"),
        ("pool read with episode key", "GET", "/v1/pool/episodes", key, {}, 403, "read_token_required"),
        ("lease without admin token", "POST", "/v1/pool/leases", None, {"json": {"max_steps": 1}}, 401, "admin_token_required"),
        ("lease with episode key", "POST", "/v1/pool/leases", key, {"json": {"max_steps": 1}}, 403, "admin_token_required"),
        ("lease without size", "POST", "/v1/pool/leases", "adm-secret", {"json": {}}, 400, None),
        ("lease negative ttl", "POST", "/v1/pool/leases", "adm-secret", {"json": {"max_steps": 1, "ttl_s": -5}}, 400, None),
        ("lease bad filter", "POST", "/v1/pool/leases", "adm-secret", {"json": {"max_steps": 1, "filter": {"colour": 1}}}, 400, None),
        ("ack unknown lease", "POST", "/v1/pool/leases/lease-nope/ack", "adm-secret", {"json": {"consumed_version": 1}}, 409, None),
        ("ack negative version", "POST", "/v1/pool/leases/lease-nope/ack", "adm-secret", {"json": {"consumed_version": -1}}, 400, None),
        ("label without admin", "POST", "/v1/pool/labels", None, {"json": {"target": "step", "target_id": step_id, "label": "x"}}, 401, None),
        ("label bad target", "POST", "/v1/pool/labels", "adm-secret", {"json": {"target": "game", "target_id": step_id, "label": "x"}}, 400, None),
        ("label unknown step", "POST", "/v1/pool/labels", "adm-secret", {"json": {"target": "step", "target_id": "step-nope", "label": "x"}}, 404, None),
        ("unknown route", "POST", "/v1/embeddings", key, {"json": {}}, 404, None),
        ("wrong method", "GET", chat, key, {}, 405, None),
    ]
    before = snapshot(gw.pool)
    failures = []
    for what, method, path, k, kw, status, code in cases:
        headers = dict(kw.pop("headers", {}))
        if k:
            headers["Authorization"] = f"Bearer {k}"
        r = gw.http.request(method, path, headers=headers, **kw)
        try:
            err = r.json()["error"]
            shape_ok = set(err) == {"message", "type", "param", "code"} and err["message"] and err["type"]
        except (ValueError, KeyError, TypeError):
            err, shape_ok = None, False
        if r.status_code != status or not shape_ok or (code is not None and err["code"] != code):
            failures.append(f"{what}: got {r.status_code} {r.text[:200]}")
    assert not failures, "\n".join(failures)
    assert snapshot(gw.pool) == before
    # the accepted work is intact and the gateway still serves
    assert gw.chat(key, [{"role": "user", "content": "still here"}]).status_code == 200
