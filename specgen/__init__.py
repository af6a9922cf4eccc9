"""specgen: short declarative kernel specs -> Triton source -> registered PyTorch ops."""
