"""Prefect flows: thin entry points that compose Hydra config and wire swarm parts."""
