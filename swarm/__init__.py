"""swarmpool: train LLM agents with RL from a persistent pool of their recorded calls."""
