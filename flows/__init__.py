"""Prefect flows: thin entry points that compose Hydra config and wire swarm parts.

Importing this package sets quiet, offline defaults before Prefect or MLflow load (each only
when unset): no telemetry, and a Prefect local-mode start-up timeout that a loaded 2-core
machine can meet. Hub access for real model ids is left alone.
"""

import os

for _key, _value in {
    "DO_NOT_TRACK": "true",  # MLflow needs the string "true"
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
    "TOKENIZERS_PARALLELISM": "false",
}.items():
    os.environ.setdefault(_key, _value)
