"""Data-parallel Trainer over torch.distributed (2 gloo processes on 127.0.0.1): ranks stay equal to a single process, only rank 0 writes."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from tiny_llama import make_tiny_llama

from swarm.merge import merge_items, micro_batches
from swarm.merge.synthetic import multiturn_items
from swarm.train import LoraSpec, TrainConfig, Trainer, distributed
from swarm.update import follow

UPDATES = 2
# full: a small budget -> 3 micro-batches, split 2 + 1 over the ranks;
# lora: one micro-batch, so rank 1 runs none and contributes zero gradients.
CASES = {
    "full": TrainConfig(lr=3e-3, lora=None, merge="tree", token_budget=40),
    "lora": TrainConfig(lr=3e-2, lora=LoraSpec(rank=4, alpha=8), merge="tree", token_budget=100_000),
}


def _items():
    return multiturn_items(1, groups=2, group_size=2, turns=2)


class _Backend:
    def __init__(self) -> None:
        self.loads: list[int] = []

    def load_weights(self, policy, state, version) -> None:
        self.loads.append(version)


def _trainable(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


def _worker(rank: int, world: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": "lo"})
    assert distributed.init_from_env("cpu", timeout_s=60)
    try:
        for name, cfg in CASES.items():
            model = make_tiny_llama(seed=4)
            if rank:
                torch.manual_seed(1234)  # a different LoRA init here: rank 0's must win
            backend = _Backend()
            trainer = Trainer(model, cfg, backend=backend, out_dir=Path(out) / name / f"rank{rank}")
            metrics: list[dict[str, float]] = []
            if distributed.is_main():
                items = _items()
                for _ in range(UPDATES):
                    distributed.broadcast_batch(items, policy=trainer.policy, version=trainer.version)
                    metrics.append(trainer.update(items))
                    trainer.publish()
                    trainer.save_checkpoint()
                distributed.broadcast_batch(None)
                n = UPDATES
            else:
                n = follow(trainer)
                trainer.save_checkpoint()
            torch.save({"weights": _trainable(trainer), "metrics": metrics, "loads": backend.loads,
                        "version": trainer.version, "updates": n}, Path(out) / name / f"result{rank}.pt")
    finally:
        distributed.shutdown()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ddp")
    mp.start_processes(_worker, args=(2, _free_port(), str(out)), nprocs=2, join=True, start_method="spawn")
    return out


def _single_process(cfg: TrainConfig) -> tuple[dict[str, torch.Tensor], list[dict[str, float]]]:
    trainer = Trainer(make_tiny_llama(seed=4), cfg)
    metrics = [trainer.update(_items()) for _ in range(UPDATES)]
    return _trainable(trainer), metrics


def test_the_cases_split_as_intended():
    batch = {n: merge_items(_items(), c.merge, c.token_budget) for n, c in CASES.items()}
    assert len(micro_batches(batch["full"].rows, CASES["full"].token_budget)) == 3
    assert len(micro_batches(batch["lora"].rows, CASES["lora"].token_budget)) == 1


@pytest.mark.parametrize("name", list(CASES))
def test_ranks_match_a_single_process_update(two_ranks, name):
    r0 = torch.load(two_ranks / name / "result0.pt", weights_only=False)
    r1 = torch.load(two_ranks / name / "result1.pt", weights_only=False)
    ref, ref_metrics = _single_process(CASES[name])
    assert r0["weights"].keys() == r1["weights"].keys() == ref.keys()
    start = _trainable(Trainer(make_tiny_llama(seed=4), CASES[name]))
    assert any(not torch.equal(ref[k], start[k]) for k in ref)  # the updates did move the weights
    for k in ref:
        torch.testing.assert_close(r1["weights"][k], r0["weights"][k], rtol=0, atol=0)  # ranks identical
        torch.testing.assert_close(r0["weights"][k], ref[k], rtol=1e-5, atol=1e-7)
    for got, want in zip(r0["metrics"], ref_metrics, strict=True):
        for key in ("train/loss", "train/tokens", "train/grad_norm", "train/clip_frac", "train/entropy"):
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), key
    assert r0["version"] == r1["version"] == UPDATES and r1["updates"] == UPDATES
    # the mismatch (sums over both ranks' shares, the max by max) of the first update, version 0 in both runs
    first, want = r0["metrics"][0], ref_metrics[0]
    assert first["mismatch/tokens"] == want["train/tokens"] > 0
    for key in ("mismatch/logprob_abs_mean", "mismatch/logprob_abs_max", "mismatch/kl_k3"):
        assert first[key] == pytest.approx(want[key], rel=1e-5), key


@pytest.mark.parametrize("name", list(CASES))
def test_only_rank_zero_writes_and_publishes(two_ranks, name):
    r0 = torch.load(two_ranks / name / "result0.pt", weights_only=False)
    r1 = torch.load(two_ranks / name / "result1.pt", weights_only=False)
    assert r0["loads"] == [1, 2] and r1["loads"] == []
    rank0 = two_ranks / name / "rank0"
    assert (rank0 / "checkpoints" / "default" / "LATEST").read_text() == f"ckpt-{UPDATES:08d}"
    assert (rank0 / "adapters" / "default" / "v000002").is_dir()
    assert not (two_ranks / name / "rank1").exists()


def test_without_a_process_group_everything_is_local():
    assert not distributed.active() and distributed.is_main() and distributed.world_size() == 1
    assert distributed.shard([3, 1, 2]) == [3, 1, 2]
    assert distributed.all_reduce_sums({"a": 1.5}) == {"a": 1.5}
    assert distributed.broadcast_batch(None) is None
    assert distributed.local_device("cpu") == "cpu"


@pytest.mark.slow
def test_torchrun_runs_the_training_flow_on_two_cpu_ranks(tmp_path):
    """``torchrun --nproc_per_node=2 -m flows.train`` (gloo): rank 0 runs the flow, rank 1 follows every update."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
           f"--master_port={_free_port()}", "-m", "flows.train", "train.updates=2", "batching.min_groups=2",
           f"train.out_dir={tmp_path / 'run'}", f"mlflow.tracking_uri=sqlite:///{tmp_path / 'mlruns.db'}",
           "mlflow.sample_trajectories=0", f"hydra.run.dir={tmp_path / 'hydra'}"]
    proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "rank 1: followed 2 updates" in proc.stdout + proc.stderr
    assert (tmp_path / "run" / "checkpoints" / "default" / "LATEST").read_text() == "ckpt-00000002"
