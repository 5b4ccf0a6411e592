"""Flow-test fixtures: one Prefect test harness per session, config composition with tmp dirs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

CONF = Path(__file__).resolve().parents[2] / "conf"




@pytest.fixture
def flow_config(tmp_path: Path) -> Callable[..., dict[str, Any]]:
    """Compose conf/train.yaml with overrides into a resolved dict writing only under tmp_path."""

    def make(*overrides: str) -> dict[str, Any]:
        # runner=thread: these in-process runs patch task and reward code that thread workers see (the default,
        # runner=process, is run by test_train_flow's process case, test_hot_swap and the subprocess flows)
        base = [f"train.out_dir={tmp_path / 'run'}", f"mlflow.tracking_uri=sqlite:///{tmp_path / 'mlruns.db'}",
                "mlflow.sample_trajectories=2", "runner=thread"]
        with initialize_config_dir(config_dir=str(CONF), version_base=None):
            cfg = compose(config_name="train", overrides=base + list(overrides))
        out = OmegaConf.to_container(cfg, resolve=True)
        assert isinstance(out, dict)
        return out

    return make
