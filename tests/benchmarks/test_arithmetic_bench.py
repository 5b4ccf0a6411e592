"""benchmarks/arithmetic_bench.py's choices, without training (a run takes an hour): which sides run, the vllm
side's trainer threads, its server's start-up read from the flow's log, the paired interval."""

from __future__ import annotations

import argparse

import pytest


def _args(**kw: object) -> argparse.Namespace:
    return argparse.Namespace(**{"backends": None, "only": None, **kw})


def test_the_default_is_still_hf_and_trl_and_backends_pick_the_sides(load_bench):
    bench = load_bench("arithmetic_bench")
    assert bench._sides(_args()) == ["hf", "trl"]  # the README's command measures what it did
    assert bench._sides(_args(only="swarm")) == ["hf"] and bench._sides(_args(only="trl")) == ["trl"]
    assert bench._sides(_args(backends="hf,vllm")) == ["hf", "vllm"]
    assert bench._sides(_args(backends="vllm, trl")) == ["vllm", "trl"]
    with pytest.raises(SystemExit, match="sglang"):
        bench._sides(_args(backends="hf,sglang"))
    assert bench.SWARM_SIDES["vllm"] == ("swarmpool_vllm", "smollm2_vllm")


def test_the_vllm_sides_trainer_threads_come_from_its_model_config_and_its_start_up_from_its_log(load_bench,
                                                                                                   tmp_path):
    bench = load_bench("arithmetic_bench")
    from omegaconf import OmegaConf

    from swarm.policy.vllm import VLLMSettings

    conf = OmegaConf.to_container(OmegaConf.load(bench.REPO / "conf" / "model" / "smollm2_vllm.yaml"))
    conf["serve"]["log_dir"] = str(tmp_path)  # the file's interpolation needs the run's config
    assert VLLMSettings(**conf).torch_threads == 1  # beside the engine's spinning threads (the bench's docstring)
    log = tmp_path / "out" / "vllm" / "vllm.log"  # the flow's local server writes its log in the run folder
    log.parent.mkdir(parents=True)
    log.write_text("# swarm: python -c <bootstrap> ...\n(APIServer pid=1) INFO 12-06 08:05:15 [api_utils.py:286] args\n"
                   "(EngineCore pid=2) INFO 12-06 08:05:38 [core.py:133] engine\n"
                   "(APIServer pid=1) INFO 12-06 08:06:12 [launcher.py:195] Route: /v1/models\n"
                   "INFO:     Application startup complete.\n(APIServer pid=1) INFO 12-06 08:09:00 later\n")
    assert bench._vllm_startup(tmp_path) == 57.0
    assert bench._vllm_startup(tmp_path / "none") is None


def test_the_paired_interval(load_bench):
    bench = load_bench("arithmetic_bench")
    gain, lo, hi = bench.paired_ci([0.0, 0.0, 0.5, 0.25], [0.5, 0.25, 0.75, 0.5])
    assert gain == pytest.approx(31.25) and lo < gain < hi and lo > 0
