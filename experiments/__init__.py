"""Task packages: one folder per task (instances, agent workflow, reward)."""
