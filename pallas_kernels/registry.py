"""One registry for every kernel operation, keyed by (operation, implementation name).

Implementations: "xla" (pure JAX; the reference path, runs everywhere), "pallas_triton"
(Pallas lowered through Triton; `interpret=True` off the GPU), "triton" (a raw Triton kernel
through jax-triton; GPU only), "mosaic_gpu" (Pallas lowered through Mosaic GPU; Hopper only).
`resolve(op, impl)` turns "auto" into the best implementation for the current backend; an
operation with a shape rule (`chooser`) may then pick another per call on a GPU, and "auto" never
picks an implementation whose `supports` rule refuses the call: it falls back along the GPU
preference to "xla", which takes every shape. The model asks for an operation and never imports
a kernel directly.
"""

from __future__ import annotations

import functools
import importlib
from typing import Callable

import jax

IMPLS = ("xla", "pallas_triton", "triton", "mosaic_gpu")
# Every operation, and the package whose import registers its implementations (each module of an
# implementation applies `register`); docs/kernels.md has the operation x implementation table.
OPERATIONS = {
    "moe_experts": "pallas_kernels.moe",
    "mla_attention": "pallas_kernels.mla_attention",
    "drafter_attention": "pallas_kernels.drafter_attention",
    "drafter_qkv": "pallas_kernels.drafter_qkv",
    "topk": "pallas_kernels.topk",
    "topk_logsumexp": "pallas_kernels.topk",
    "tree_search": "pallas_kernels.tree_search",
    "tree_accept": "pallas_kernels.tree_accept",
}
_REGISTRY: dict[str, dict[str, Callable]] = {}
_CHOOSERS: dict[str, Callable[..., str]] = {}
_SUPPORTS: dict[tuple[str, str], Callable[..., str | None]] = {}
# Preference order for impl="auto" on a GPU backend; the CPU always gets "xla".
_GPU_PREFERENCE = ("pallas_triton", "triton", "xla")


def register(op: str, impl: str, supports: Callable[..., str | None] | None = None):
    """Decorator: register `fn` as implementation `impl` of operation `op`. supports(*args,
    **kwargs) (same arguments as fn, called at trace time) -> None, or why `fn` cannot take the
    call (fn itself then raises ValueError with that reason); None: every call."""
    if impl not in IMPLS:
        raise ValueError(f"unknown kernel implementation {impl!r}; expected one of {IMPLS}")
    if op not in OPERATIONS:
        raise ValueError(f"unknown kernel operation {op!r}: add it to registry.OPERATIONS")

    def deco(fn):
        _REGISTRY.setdefault(op, {})[impl] = fn
        if supports is not None:
            _SUPPORTS[(op, impl)] = supports
        return fn

    return deco


def chooser(op: str):
    """Decorator: `fn(*args, **kwargs) -> impl name`, called (at trace time, so on static shapes)
    by the function `get(op, "auto")` returns on a GPU backend, for operations whose best
    implementation depends on the shapes."""
    def deco(fn):
        _CHOOSERS[op] = fn
        return fn

    return deco


def implementations(op: str) -> tuple[str, ...]:
    _load_all()
    if op not in OPERATIONS:
        raise KeyError(f"unknown kernel operation {op!r}; known: {sorted(OPERATIONS)}")
    return tuple(i for i in IMPLS if i in _REGISTRY.get(op, {}))


def resolve(op: str, impl: str = "auto") -> str:
    """The implementation name `get(op, impl)` would use on the default backend."""
    available = implementations(op)
    if impl == "auto":
        if jax.default_backend() != "gpu":
            return "xla"
        return next(i for i in _GPU_PREFERENCE if i in available)
    if impl not in available:
        raise ValueError(f"kernel operation {op!r} has no implementation {impl!r}; "
                         f"available: {available}")
    return impl


def get(op: str, impl: str = "auto") -> Callable:
    """The function implementing `op` under `impl` ("auto" picks by backend, and on a GPU per call
    by the operation's shape rule and its implementations' `supports` rules)."""
    name = resolve(op, impl)  # loads the kernel modules first
    if impl == "auto" and jax.default_backend() == "gpu" and (
            op in _CHOOSERS or any(key[0] == op for key in _SUPPORTS)):
        return functools.partial(_dispatch, op)
    return _REGISTRY[op][name]


def auto_impl(op: str, *args, **kwargs) -> str:
    """The implementation impl="auto" takes on a GPU for this call: the shape rule's pick (else
    the GPU preference's first), or the next in the preference whose `supports` rule takes it."""
    available = implementations(op)
    first = [_CHOOSERS[op](*args, **kwargs)] if op in _CHOOSERS else []
    for impl in first + [i for i in _GPU_PREFERENCE if i in available]:
        rule = _SUPPORTS.get((op, impl))
        if rule is None or rule(*args, **kwargs) is None:
            return impl
    raise ValueError(f"kernel operation {op!r}: no implementation takes this call")


def _dispatch(op: str, *args, **kwargs):
    return _REGISTRY[op][auto_impl(op, *args, **kwargs)](*args, **kwargs)


@functools.cache
def _load_all() -> None:
    # Importing the kernel packages registers their implementations.
    for package in sorted(set(OPERATIONS.values())):
        importlib.import_module(package)
