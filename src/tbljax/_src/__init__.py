"""Tbljax's private rooms, upstream first: rules → io → engine → jax → adapters → tools.

Nothing here is public API: users import `tbljax`, `tbljax.torch`, `tbljax.mlx`, `tbljax.ops`,
`tbljax.kernels`, `tbljax.order`, `tbljax.augment` and `tbljax.show`. docs/architecture.md is
the map; tests/test_architecture.py holds every module to it.
"""
