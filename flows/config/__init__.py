"""The typed run config of ``flows.train``, ``flows.serve`` and ``flows.eval``.

- :mod:`flows.config.schema`: the sections and :func:`validate` (a bad key is one line naming it and the close
  one; messages from :mod:`swarm.explain`); extension points come from their registries
  (:data:`swarm.policy.settings.BACKENDS`, :data:`swarm.rewards.REWARDS`), not from lists here.
- :mod:`flows.config.checks`: what needs imports or connections (the task package, the pool's database).

Building objects from the sections is :mod:`flows.components`' job, not this package's.
"""

from flows.config.checks import check_pool_url, check_task, make_train_config, workers_elsewhere
from flows.config.schema import (
    EVAL_SEED,
    AlgoSection,
    BatchingSection,
    EvalConfig,
    EvalSection,
    FeedbackSection,
    GatewaySection,
    MlflowSection,
    Model,
    PoolSection,
    ProcessRunner,
    RayRunner,
    Reward,
    RunConfig,
    Runner,
    ServeConfig,
    TaskSection,
    ThreadRunner,
    TrainSection,
    Tree,
    model_section,
    validate,
)
from swarm.errors import ConfigError

__all__ = ["ConfigError", "RunConfig", "ServeConfig", "EvalConfig", "TaskSection", "TrainSection", "BatchingSection",
           "MlflowSection", "AlgoSection", "PoolSection", "GatewaySection", "FeedbackSection", "EvalSection", "Model",
           "Reward", "ThreadRunner", "ProcessRunner", "RayRunner", "Runner", "Tree", "EVAL_SEED", "validate",
           "model_section", "check_task", "check_pool_url", "make_train_config", "workers_elsewhere"]
