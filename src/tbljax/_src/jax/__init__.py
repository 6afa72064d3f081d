"""Jax: tbljax as JAX sees it — the loader of global `jax.Array`s, the kernel inside `jax.jit`
(XLA FFI targets and their pure-JAX twin), the dataset resident on device."""
