"""A plugin package outside swarm, as a user's would be: it declares a pool engine (see memory_engine.py)."""
