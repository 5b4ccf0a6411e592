"""Scale-out fixtures: loopback-only Ray settings, set before anything imports ray.

The module-scoped PostgreSQL database (``pg_url``) comes from tests/conftest.py.
"""

from __future__ import annotations

import os

# Loopback-only Ray (../shared/ENVIRONMENT.md), set before anything imports ray
for _k, _v in {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}.items():
    os.environ.setdefault(_k, _v)
