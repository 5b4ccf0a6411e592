"""Research agent: plain-English task descriptions to validated task packages."""
