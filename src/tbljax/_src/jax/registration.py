"""The XLA FFI handlers of the gather, registered with JAX once, when this module is imported:
the CPU handlers compiled into `tbljax._core` and, when built, the CUDA ones of
`tbljax._ffi_cuda`. The target names are the C++ core's (ffi/core/serve/contract.h)."""

from __future__ import annotations

import jax

from tbljax import _core

__all__ = [
    "PACKED_OPS_TARGET",
    "PACKED_TARGET",
    "OPS_TARGET",
    "TARGET",
    "handler_platforms",
    "ops_platforms",
    "registered_platforms",
]

TARGET: str = _core.GATHER_TARGET  # records of one size, (N, H, W, 3)
PACKED_TARGET: str = _core.GATHER_PACKED_TARGET  # records of different sizes, PackedRecords
OPS_TARGET: str = _core.GATHER_OPS_TARGET  # TARGET with the per-image ops (ops=)
PACKED_OPS_TARGET: str = _core.GATHER_PACKED_OPS_TARGET


def _register() -> tuple[dict[str, str], dict[str, str], tuple[str, ...]]:
    """({platform as lax.platform_dependent spells it: module}, {platform: why not}, the
    platforms whose handlers run the per-image ops)."""
    registered, missing, ops = {}, {}, []
    # The CPU handlers live in _core itself (one thread pool, one SIMD target with the loader);
    # a build without XLA's FFI headers leaves them out, and the twin serves CPU too.
    cpu_registrations = getattr(_core, "xla_registrations", None)
    if cpu_registrations is None:
        missing["cpu"] = (
            "tbljax._core was built without the XLA CPU handlers (no XLA FFI "
            "headers: jax.ffi.include_dir() was not available to the build)"
        )
    else:
        for name, capsule in cpu_registrations().items():
            jax.ffi.register_ffi_target(name, capsule, platform="cpu")
        registered["cpu"] = "tbljax._core"
        ops += ["cpu"] if OPS_TARGET in cpu_registrations() else []
    try:
        from tbljax import _ffi_cuda
    except ImportError as e:  # the common case: a build without -DTBLJAX_CUDA=ON
        missing["cuda"] = f"tbljax._ffi_cuda is not built ({e})"
    else:
        try:
            for name, capsule in _ffi_cuda.registrations().items():
                jax.ffi.register_ffi_target(name, capsule, platform="CUDA")
            registered["cuda"] = "tbljax._ffi_cuda"
            ops += ["cuda"] if OPS_TARGET in _ffi_cuda.registrations() else []
        except Exception as e:  # noqa: BLE001 - jaxlib without a CUDA plugin: not fatal on CPU
            missing["cuda"] = f"tbljax._ffi_cuda could not be registered ({e})"
    return registered, missing, tuple(ops)


_REGISTERED, _MISSING, _OPS = _register()


def handler_platforms() -> tuple[str, ...]:
    """The platforms (as `jax.lax.platform_dependent` spells them) with a registered handler."""
    return tuple(_REGISTERED)


def ops_platforms() -> tuple[str, ...]:
    """The platforms whose handler runs the per-image ops (``gather_normalize(ops=...)``)."""
    return _OPS


def registered_platforms() -> dict[str, str]:
    """{platform: reason}: where the FFI handler runs ("registered by ...") and, for cpu and
    cuda, why it does not. Platforms without a handler (e.g. tpu) use the pure-JAX twin.

    >>> "cpu" in registered_platforms()
    True
    """
    out = {p: f"registered by {m}" for p, m in _REGISTERED.items()}
    out.update({p: f"not registered: {why}" for p, why in _MISSING.items()})
    return out
