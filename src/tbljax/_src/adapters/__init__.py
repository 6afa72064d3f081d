"""Adapters: the same engine served to PyTorch and MLX, and what the two share."""
