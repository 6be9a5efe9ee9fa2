"""Bytes per device of a sharded DDTree deployment: params by group, caches, verify activations.

Everything that has a shape comes from the code itself, so the plan follows the model and the
rules as they change: the parameter tree is `jax.eval_shape` of `init_target` / `init_drafter` (no
allocation; INT4 experts in the kernel layout of pallas_kernels/moe/int4.py, K padded to 256), the
caches are `eval_shape` of the engine's `init_cache` / `init_drafter_cache`, and every array's
shard shape follows the PartitionSpec that `sharding.param_specs` / `sharding.spec` give on an
`AbstractMesh` of the planned shape (no devices needed).

The verify step's activations are an estimate (see `activation_bytes`): the largest buffers live at
one time per device, for the Pallas:Triton kernels (flash attention: no score matrix), with the
engine's state donated so cache writes happen in place.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from typing import Sequence

import jax
import jax.numpy as jnp
from jax.sharding import AbstractMesh

from ddtree_jax import drafter as dft
from ddtree_jax import model as tgt
from ddtree_jax import sharding
from ddtree_jax.config import DrafterConfig, ModelConfig

GB = 1e9
GIB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class Device:
    """Memory of one accelerator: nominal (datasheet) and usable (after the runtime's context)."""

    name: str
    nominal_bytes: float
    usable_bytes: float
    source: str


DEVICES = {
    "H200": Device("H200", 141e9, 139 * GIB, "141 GB HBM3e nominal; ~139 GiB usable after the CUDA "
                   "context (JAX preallocates 75% unless XLA_PYTHON_CLIENT_MEM_FRACTION is raised)"),
}

# Parameter groups: (name, regex on the '/'-joined path); first match wins.
PARAM_GROUPS: tuple[tuple[str, str], ...] = (
    ("norms", r"(norm|layernorm)/scale$"),
    ("embed", r"^embed_tokens/"),
    ("lm_head", r"^lm_head/"),
    ("routed_qweight", r"/mlp/experts/\w+_qweight$"),
    ("routed_qscale", r"/mlp/experts/\w+_qscale$"),
    ("routed_bf16", r"/mlp/experts/"),
    ("router", r"/mlp/gate/"),
    ("shared_experts", r"/mlp/shared_experts/"),
    ("dense_mlp", r"/mlp/(gate|up|down)_proj/"),
    ("attention", r"/self_attn/"),
)


@functools.lru_cache(maxsize=None)
def param_group(path: str) -> str:
    """The group of the target parameter at '/'-joined `path` ("other" if none matches)."""
    return next((name for name, pattern in PARAM_GROUPS if re.search(pattern, path)), "other")


@dataclasses.dataclass(frozen=True)
class Workload:
    """The engine's state for one deployment.

    streams S; context: tokens per stream the caches hold (prompt + generated); budget B (B + 1
    verified tokens per stream); dtype of the non-INT4 params and of the caches; sampling: whether
    temperature > 0 (the accept stage then holds a float32 log-softmax of the logits).
    """

    streams: int
    context: int
    budget: int
    dtype: str = "bfloat16"
    sampling: bool = False

    def __post_init__(self):
        for name, low in (("streams", 1), ("context", 0), ("budget", 1)):
            v = getattr(self, name)
            if not isinstance(v, int) or v < low:
                raise ValueError(f"Workload.{name} must be an int >= {low}, got {v!r}")
        try:
            jnp.dtype(self.dtype)
        except TypeError as e:
            raise ValueError(f"Workload.dtype: not a dtype name, got {self.dtype!r}") from e

    @property
    def max_len(self) -> int:
        """Cache slots per stream: context + the budget + 1 slots a verify step writes, rounded up
        to model.CACHE_SLOT_ALIGN (as engine.setup allocates)."""
        return tgt.aligned_slots(self.context + self.budget + 1)


def abstract_mesh(shape: Sequence[int]) -> AbstractMesh:
    """A device-less ("data", "expert", "tensor") mesh of `shape`."""
    shape = tuple(int(s) for s in shape)
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"mesh shape must be three positive ints (data, expert, tensor), got {shape}")
    return AbstractMesh(shape, sharding.AXES)


def mesh_shapes(devices: int) -> list[tuple[int, int, int]]:
    """Every (data, expert, tensor) with data * expert * tensor == devices."""
    if devices < 1:
        raise ValueError(f"devices must be >= 1, got {devices}")
    return [(d, e, devices // (d * e)) for d in range(1, devices + 1) if devices % d == 0
            for e in range(1, devices // d + 1) if (devices // d) % e == 0]


def shard_shape(shape: Sequence[int], pspec, mesh) -> tuple[int, ...]:
    """Per-device shape of an array of `shape` laid out by PartitionSpec `pspec` on `mesh`."""
    sizes = dict(mesh.shape)
    entries = tuple(pspec) + (None,) * (len(shape) - len(pspec))
    axes = lambda e: () if e is None else (e,) if isinstance(e, str) else tuple(e)
    return tuple(-(-dim // math.prod(sizes[a] for a in axes(e))) for dim, e in zip(shape, entries))


def _bytes(shape, dtype) -> int:
    return math.prod(shape) * jnp.dtype(dtype).itemsize


def local_size(logical: str, size: int, mesh) -> int:
    """Per-device extent of a dimension of `size` along logical axis `logical` (e.g. "heads")."""
    return shard_shape((size,), sharding.spec((logical,), (size,), mesh), mesh)[0]


@functools.lru_cache(maxsize=16)
def target_shapes(cfg: ModelConfig, dtype: str = "bfloat16"):
    """ShapeDtypeStruct pytree of `init_target(cfg, dtype=dtype)` (no allocation). A layer's params
    depend only on the dims and its kind (`cfg.is_moe_layer`), so one layer of each kind is traced
    (the model cut after the last of them) and shared by the rest: Kimi K2.6's 61 layers in ~1 s
    on the CPU, against ~24 s for tracing every layer."""
    first = {}                                            # kind -> its first layer
    for i in range(cfg.num_hidden_layers):
        first.setdefault(cfg.is_moe_layer(i), i)
    cut = truncate(cfg, max(first.values()) + 1)
    traced = jax.eval_shape(functools.partial(tgt.init_target, cut, dtype=jnp.dtype(dtype)), jax.random.key(0))
    out = first_layers(traced, 0)                         # embedding, final norm, head
    out.update({f"layers_{i}": traced[f"layers_{first[cfg.is_moe_layer(i)]}"] for i in range(cfg.num_hidden_layers)})
    return out


@functools.lru_cache(maxsize=16)
def drafter_shapes(dcfg: DrafterConfig, dtype: str = "bfloat16"):
    """ShapeDtypeStruct pytree of `init_drafter(dcfg, dtype=dtype)` (no allocation)."""
    return jax.eval_shape(functools.partial(dft.init_drafter, dcfg, dtype=jnp.dtype(dtype)),
                          jax.random.key(0))


def param_bytes(shapes, mesh, group=param_group) -> dict[str, int]:
    """Bytes per device by group of a params pytree (arrays or ShapeDtypeStructs) sharded by
    `sharding.param_specs` on `mesh` (a Mesh or AbstractMesh); `group(path)` names the group."""
    specs = sharding.param_specs(shapes, mesh)
    out: dict[str, int] = {}
    for (kp, x), ps in zip(jax.tree_util.tree_flatten_with_path(shapes)[0], jax.tree.leaves(specs)):
        g = group(sharding.path_str(kp))
        out[g] = out.get(g, 0) + _bytes(shard_shape(x.shape, ps, mesh), x.dtype)
    return out


def cache_bytes(cfg: ModelConfig, dcfg: DrafterConfig, work: Workload, mesh) -> dict[str, int]:
    """Bytes per device of the target latent cache (all layers) and the drafter's context K/V,
    shaped by the engine's constructors and sharded by sharding.LATENT_CACHE / DRAFTER_CACHE."""
    dtype = jnp.dtype(work.dtype)
    t = jax.eval_shape(lambda: tgt.init_cache(cfg, work.streams, work.max_len, dtype))
    d = jax.eval_shape(lambda: dft.init_drafter_cache(dcfg, work.streams, work.max_len, dtype))

    def total(arrays, logical):
        return sum(_bytes(shard_shape(a.shape, sharding.spec(logical, a.shape, mesh), mesh), a.dtype)
                   for a in arrays)

    return {"target_latent": total(t.kv, sharding.LATENT_CACHE),
            "drafter_kv": total((d.k, d.v), sharding.DRAFTER_CACHE)}


def activation_bytes(cfg: ModelConfig, dcfg: DrafterConfig, work: Workload, mesh) -> dict[str, int]:
    """Estimated bytes per device of the verify step's largest live buffers (T = S/data x (B+1)
    local tokens, dtype `w`, float32 `f`):

      residual  3 [T, d] w (x, h, the normed input of the next block)
      taps      [T, taps x d] w (the drafter's taps, live to the accept stage)
      mla       q_a [T, q_lora] + q [T, H_l, qk_head] + absorbed q [T, H_l, latent] w
                + attention output [T, H_l, kv_lora] f (split-K partials) + [T, H_l, v_head] w
      moe       Pallas:Triton buffers for the T x k slots (every expert shard sees all its
                streams' slots), in slot layout: h [T k, I] w and y [T k, d] f (with float16
                expert scales h is float32 plus a float16 copy: not counted)
      dense_mlp 3 [T, I_l] w (layer 0's SwiGLU)
      logits    [T, V_l] f, + a float32 log-softmax copy when sampling
      peak      residual + taps + max(mla, moe, dense_mlp, logits)

    Not counted: XLA's fusion temporaries and allocator fragmentation (compare with the compiled
    verify's temp bytes, which experiments/k2_step_bench.py prints on the device).
    """
    w, f = jnp.dtype(work.dtype).itemsize, 4
    d, h = cfg.hidden_size, cfg.num_attention_heads
    t = local_size("streams", work.streams, mesh) * (work.budget + 1)
    h_l = local_size("heads", h, mesh)
    q_in = cfg.q_lora_rank or 0
    mla = t * ((q_in + h_l * (cfg.qk_head_dim + cfg.latent_dim + cfg.v_head_dim)) * w
               + h_l * cfg.kv_lora_rank * f)
    k = cfg.num_experts_per_tok
    moe = t * k * (cfg.moe_intermediate_size * w + d * f)
    dense = 3 * t * local_size("mlp", cfg.intermediate_size, mesh) * w
    logits = t * local_size("vocab", cfg.vocab_size, mesh) * f * (2 if work.sampling else 1)
    parts = {"residual": 3 * t * d * w, "taps": t * len(dcfg.target_layer_ids) * d * w,
             "mla": mla, "moe": moe, "dense_mlp": dense, "logits": logits}
    parts["peak"] = parts["residual"] + parts["taps"] + max(mla, moe, dense, logits)
    return parts


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Bytes per device of one deployment on mesh (data, expert, tensor)."""

    mesh: tuple[int, int, int]
    device: Device
    params: dict            # target params by group (PARAM_GROUPS)
    drafter_params: int
    caches: dict            # target_latent, drafter_kv
    activations: dict       # activation_bytes' parts; "peak" is what counts
    work: Workload
    max_positions: int      # the model's max_position_embeddings

    @property
    def total(self) -> int:
        return (sum(self.params.values()) + self.drafter_params + sum(self.caches.values())
                + self.activations["peak"])

    @property
    def fits(self) -> bool:
        return self.total <= self.device.usable_bytes

    @property
    def cache_bytes_per_token(self) -> float:
        """Cache bytes per device per token of context (every stream one more token)."""
        return sum(self.caches.values()) / self.work.max_len

    @property
    def max_context(self) -> int:
        """Largest context per stream that fits, the rest of the plan unchanged (< 0: none), at most
        the model's max_position_embeddings."""
        free = self.device.usable_bytes - (self.total - sum(self.caches.values()))
        return min(int(free // self.cache_bytes_per_token) - self.work.budget - 1, self.max_positions)

    def row(self) -> dict:
        """Flat GB-per-device summary (GB = 1e9 bytes): every param group, caches, totals."""
        p = self.params
        r = {"mesh": "x".join(map(str, self.mesh)), "devices": math.prod(self.mesh)}
        r.update({f"{g}_gb": p.get(g, 0) / GB for g, _ in PARAM_GROUPS + (("other", ""),)})
        r["embed_lm_head_gb"] = r["embed_gb"] + r["lm_head_gb"]
        r["norms_router_gb"] = r["norms_gb"] + r["router_gb"]
        r["params_gb"] = sum(p.values()) / GB
        r["drafter_gb"] = self.drafter_params / GB
        r["latent_cache_gb"] = self.caches["target_latent"] / GB
        r["drafter_cache_gb"] = self.caches["drafter_kv"] / GB
        r["activations_gb"] = self.activations["peak"] / GB
        r["total_gb"] = self.total / GB
        r["usable_gb"] = self.device.usable_bytes / GB
        r["nominal_gb"] = self.device.nominal_bytes / GB
        r["fits"] = self.fits
        r["max_context"] = self.max_context if self.max_context >= 0 else None   # None: no context fits
        return r


# The summary table's columns (a table may drop the ones that are zero in every row).
PLAN_COLUMNS = ("mesh", "routed_qweight_gb", "routed_qscale_gb", "routed_bf16_gb", "attention_gb",
                "embed_lm_head_gb", "shared_experts_gb", "dense_mlp_gb", "norms_router_gb", "other_gb",
                "params_gb", "drafter_gb", "latent_cache_gb", "drafter_cache_gb", "activations_gb",
                "total_gb", "usable_gb", "fits", "max_context")


def plan(cfg: ModelConfig, dcfg: DrafterConfig, mesh_shape: Sequence[int], work: Workload,
         device: str | Device = "H200", shapes=None) -> MemoryPlan:
    """The memory plan of `cfg` + drafter `dcfg` serving `work` on a (data, expert, tensor) mesh
    (shapes: the target's param shapes if already at hand, default `target_shapes(cfg)`)."""
    if isinstance(device, str):
        if device not in DEVICES:
            raise ValueError(f"device must be one of {sorted(DEVICES)} or a Device, got {device!r}")
        device = DEVICES[device]
    dcfg.check_target(cfg)
    mesh = abstract_mesh(mesh_shape)
    return MemoryPlan(
        mesh=tuple(mesh.shape.values()), device=device,
        params=param_bytes(target_shapes(cfg, work.dtype) if shapes is None else shapes, mesh),
        drafter_params=sum(param_bytes(drafter_shapes(dcfg, work.dtype), mesh).values()),
        caches=cache_bytes(cfg, dcfg, work, mesh), activations=activation_bytes(cfg, dcfg, work, mesh),
        work=work, max_positions=cfg.max_position_embeddings)


def plans_for(cfg: ModelConfig, dcfg: DrafterConfig, devices: int, work: Workload,
              device: str | Device = "H200") -> list[MemoryPlan]:
    """`plan` on every (data, expert, tensor) factorisation of `devices`, smallest total first."""
    return sorted((plan(cfg, dcfg, m, work, device) for m in mesh_shapes(devices)),
                  key=lambda p: p.total)


def smallest_fit(cfg: ModelConfig, dcfg: DrafterConfig, work: Workload, device: str | Device = "H200",
                 max_devices: int = 64) -> MemoryPlan | None:
    """The fitting plan with the fewest devices (then the smallest total), or None up to max_devices."""
    one = plan(cfg, dcfg, (1, 1, 1), work, device)
    floor = sum(one.params.values()) + one.drafter_params      # n devices hold >= 1/n of it each
    for n in range(1, max_devices + 1):
        if floor / n > one.device.usable_bytes:
            continue
        fit = [p for p in plans_for(cfg, dcfg, n, work, device) if p.fits]
        if fit:
            return fit[0]
    return None


def max_layers(cfg: ModelConfig, mesh_shape: Sequence[int], work: Workload,
               device: str | Device = "H200", **drafter_overrides) -> int:
    """The most decoder layers of `cfg` (its first n, see `truncate`; drafter from
    `DrafterConfig.for_target(..., **drafter_overrides)`) that fit on `mesh_shape`; 0 if none."""
    full = target_shapes(cfg, work.dtype)

    def fits(n: int) -> bool:
        c = truncate(cfg, n)
        return plan(c, DrafterConfig.for_target(c, **drafter_overrides), mesh_shape, work, device,
                    shapes=first_layers(full, n)).fits

    lo, hi = 0, cfg.num_hidden_layers             # fits(lo) holds (or lo == 0); bytes grow with n
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def first_layers(shapes: dict, layers: int) -> dict:
    """A target params pytree cut to its first `layers` decoder layers (the `layers_{i}` entries):
    the params of `truncate(cfg, layers)`, since a layer's params depend only on the dims and i."""
    return {k: v for k, v in shapes.items()
            if not (re.fullmatch(r"layers_\d+", k) and int(k[len("layers_"):]) >= layers)}


def truncate(cfg: ModelConfig, layers: int) -> ModelConfig:
    """`cfg` with its first `layers` decoder layers (same dims; layer kinds as in the full model)."""
    if not 1 <= layers <= cfg.num_hidden_layers:
        raise ValueError(f"layers must lie in [1, {cfg.num_hidden_layers}], got {layers}")
    return cfg.replace(num_hidden_layers=layers,
                       first_k_dense_replace=min(cfg.first_k_dense_replace, layers))
