"""Device meshes, the logical-axis rules, and the collective forms of the model's sharded ops.

Mesh axes: "data" (streams), "expert" (routed experts), "tensor" (attention heads, MLP width,
vocabulary). Code names what a dimension *is* (a logical axis: "streams", "heads", "vocab", ...);
`RULES` is the one table saying which mesh axes shard it. A dimension the mesh axes do not divide
keeps the longest prefix of them that does (possibly none: replicated); size-1 mesh axes are left out.

The model calls `constrain`, `vocab_embed`, `attention`, `moe_experts` and `topk_logsumexp`. With
no mesh set (`jax.set_mesh(mesh)` as a context manager around the calls) each is the plain
single-device computation; under a mesh the routed experts, the attention kernel, the embedding
lookup and the draft top-K run per shard through `jax.shard_map` with explicit collectives, and
everything else is partitioned by XLA from the parameter and cache shardings. The kernels run
inside `shard_map` unchanged (per-shard shapes), so those shard_maps skip the varying-axes check.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

AXES = ("data", "expert", "tensor")

RULES: dict[str, tuple[str, ...]] = {
    "streams": ("data",),
    "experts": ("expert", "tensor"),   # expert parallelism over every non-data device
    "heads": ("tensor",),
    "kv_heads": ("tensor",),
    "mlp": ("tensor",),
    "vocab": ("tensor",),
}

# Parameters: (regex on the '/'-joined pytree path, logical axis of each dim); first match wins,
# anything unmatched (norms, q_a_proj, kv_a_proj_with_mqa, router, drafter fc) is replicated.
PARAM_RULES: tuple[tuple[str, tuple], ...] = (
    (r"(^|/)embed_tokens/embedding$", ("vocab", None)),             # [V, d]
    (r"(^|/)lm_head/kernel$", (None, "vocab")),                      # [d, V]
    (r"/mlp/experts/", ("experts", None, None)),                     # [E, ., .] every leaf
    (r"self_attn/(q_proj|q_b_proj|kv_b_proj)/kernel$", (None, "heads")),  # head-major columns
    (r"self_attn/(k_proj|v_proj)/kernel$", (None, "kv_heads")),
    (r"self_attn/o_proj/kernel$", ("heads", None)),
    (r"(gate_proj|up_proj)/kernel$", (None, "mlp")),                 # dense, shared, drafter MLPs
    (r"down_proj/kernel$", ("mlp", None)),
)

LATENT_CACHE = ("streams", None, None)                  # target kv[l] [S, max_len, latent]
DRAFTER_CACHE = (None, "streams", "kv_heads", None, None)  # drafter k, v [L, S, KV, max_ctx, hd]


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Devices along each mesh axis; their product is the number of devices used."""

    data: int = 1
    expert: int = 1
    tensor: int = 1

    @classmethod
    def parse(cls, text: str) -> "MeshConfig":
        """"data,expert,tensor", e.g. "1,8,1"."""
        parts = [int(p) for p in text.split(",")]
        if len(parts) != 3 or min(parts) < 1:
            raise ValueError(f"mesh must be three positive ints 'data,expert,tensor', got {text!r}")
        return cls(*parts)

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.data, self.expert, self.tensor)


def make_mesh(shape: MeshConfig | Sequence[int], devices=None) -> Mesh:
    """A ("data", "expert", "tensor") mesh of `shape` over `devices` (default: the first
    prod(shape) of jax.devices(), ordered by XLA for locality)."""
    shape = shape.shape if isinstance(shape, MeshConfig) else tuple(int(s) for s in shape)
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"mesh shape must be three positive ints (data, expert, tensor), got {shape}")
    n = math.prod(shape)
    devices = jax.devices()[:n] if devices is None else list(devices)
    if len(devices) != n:
        raise ValueError(f"mesh {shape} needs {n} devices, got {len(devices)} "
                         f"(jax.device_count() = {jax.device_count()})")
    return jax.make_mesh(shape, AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)


# ---- rules -> PartitionSpecs --------------------------------------------------------------------

def current_mesh():
    """The mesh set by `jax.set_mesh`, or None."""
    mesh = jax.sharding.get_abstract_mesh()
    return None if mesh.empty else mesh


def _mesh_axes(name, dim: int, sizes: dict) -> tuple[str, ...]:
    axes = tuple(a for a in RULES[name] if sizes.get(a, 1) > 1) if name else ()
    while axes and dim % math.prod(sizes[a] for a in axes):
        axes = axes[:-1]
    return axes


def spec(logical: Sequence[str | None], shape: Sequence[int], mesh=None) -> P:
    """PartitionSpec for an array of `shape` whose dims are the logical axes `logical`
    (mesh: a Mesh or AbstractMesh; default the current one; none at all: fully replicated)."""
    mesh = mesh if mesh is not None else current_mesh()
    if len(logical) != len(shape):
        raise ValueError(f"logical axes {tuple(logical)} do not match shape {tuple(shape)}")
    sizes = dict(mesh.shape) if mesh is not None else {}
    out = []
    for name, dim in zip(logical, shape):
        axes = _mesh_axes(name, dim, sizes)
        out.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return P(*out)


def param_logical_axes(path: str, ndim: int) -> tuple:
    """Logical axes of the parameter at '/'-joined `path` (see PARAM_RULES)."""
    for pattern, axes in PARAM_RULES:
        if re.search(pattern, path):
            if len(axes) != ndim:
                raise ValueError(f"param {path}: rule {axes} does not fit a {ndim}-d array")
            return axes
    return (None,) * ndim


def path_str(key_path) -> str:
    """jax key path of a dict pytree -> 'a/b/c'."""
    return "/".join(str(getattr(k, "key", k)) for k in key_path)


def param_specs(params, mesh=None):
    """The PartitionSpec of every leaf of a params pytree (arrays or ShapeDtypeStructs)."""
    return jax.tree_util.tree_map_with_path(
        lambda kp, x: spec(param_logical_axes(path_str(kp), x.ndim), x.shape, mesh), params)


def param_shardings(params, mesh: Mesh):
    """NamedSharding of every leaf of a params pytree on `mesh`."""
    return jax.tree.map(lambda s: NamedSharding(mesh, s), param_specs(params, mesh))


def place(host: np.ndarray, path: str, mesh: Mesh) -> jax.Array:
    """Put a host array (the parameter at `path`) on `mesh` by the rules; each device receives
    only its own slice."""
    sharding = NamedSharding(mesh, spec(param_logical_axes(path, host.ndim), host.shape, mesh))
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def place_experts(prepare: Callable, stacks: Sequence[np.ndarray], path: str, mesh: Mesh) -> dict:
    """Routed experts on `mesh`: `prepare(*stacks)` (host arrays, expert axis first -> the kernel's
    experts dict) runs on one expert shard at a time and each result goes to that shard's
    devices, so no device holds more than its own experts."""
    num_experts = stacks[0].shape[0]
    layout = jax.eval_shape(prepare, *(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in stacks))
    prepared: dict = {}

    def shard(index, key):
        rows = slice(*index[0].indices(num_experts))        # only the expert axis is sharded
        if (rows.start, rows.stop) not in prepared:
            prepared[rows.start, rows.stop] = jax.tree.map(np.asarray, prepare(*(a[rows] for a in stacks)))
        return prepared[rows.start, rows.stop][key]

    return {key: jax.make_array_from_callback(
                leaf.shape, NamedSharding(mesh, spec(param_logical_axes(f"{path}/{key}", leaf.ndim),
                                                     leaf.shape, mesh)),
                functools.partial(shard, key=key))
            for key, leaf in layout.items()}


def constrain(x, logical: Sequence[str | None]):
    """with_sharding_constraint by logical axes under the current mesh; x itself without one."""
    mesh = current_mesh()
    return x if mesh is None else jax.lax.with_sharding_constraint(x, spec(logical, x.shape, mesh))


# ---- collective forms of the model's ops ---------------------------------------------------------

def _single(entry) -> tuple[str, ...]:
    """A PartitionSpec entry as a tuple of mesh axes."""
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def _shard_offset(axes: tuple[str, ...], local_size: int):
    return jax.lax.axis_index(axes) * local_size


def vocab_embed(table, tokens):
    """table [V, d], tokens int [S, ...] -> table[tokens] [S, ..., d]. Vocabulary-parallel under a
    mesh: each shard looks up the tokens it holds (zeros elsewhere) and a psum combines."""
    mesh = current_mesh()
    vocab = _single(spec(("vocab", None), table.shape, mesh)[0]) if mesh is not None else ()
    if not vocab:
        return table[tokens]
    tspec = spec(("streams",) + (None,) * (tokens.ndim - 1), tokens.shape, mesh)

    def local(tab, tok):
        rel = tok - _shard_offset(vocab, tab.shape[0])
        mine = (rel >= 0) & (rel < tab.shape[0])
        rows = jnp.where(mine[..., None], tab[jnp.clip(rel, 0, tab.shape[0] - 1)], 0)
        return jax.lax.psum(rows, vocab)

    return jax.shard_map(local, in_specs=(P(vocab, None), tspec), out_specs=P(*tspec, None))(
        table, tokens)


def attention(fn: Callable, q, kv, lengths, node_mask, heads_first: bool = False, q_rope=None):
    """fn(q [S,Q,H,Dk], kv [S,N,Dk], lengths [S], node_mask [S,Q,W], q_rope=..) -> [S,Q,H,Dv]
    (the "mla_attention" op, scale and v_dim bound), run per (stream, head) shard under a mesh;
    heads_first: q and the output are [S,H,Q,.]; q_rope (optional, q's layout): the query's rope
    part given apart from its latent part q."""
    mesh = current_mesh()
    axes = ("streams", "heads", None, None) if heads_first else ("streams", None, "heads", None)
    qspec = spec(axes, q.shape, mesh)
    call = lambda q_, kv_, lens_, mask_, rope_: fn(q_, kv_, lens_, mask_, q_rope=rope_)
    if mesh is None or qspec == P(None, None, None, None):
        return call(q, kv, lengths, node_mask, q_rope)
    s = qspec[0]
    return jax.shard_map(call, in_specs=(qspec, P(s, None, None), P(s), P(s, None, None),
                                         None if q_rope is None else qspec),
                         out_specs=qspec, check_vma=False)(q, kv, lengths, node_mask, q_rope)


def per_stream(fn: Callable, *args):
    """fn(*args) for an operation whose streams are independent: every array leaf of args and of
    the result is [S, ...] (the "tree_accept" op). Under a mesh each streams shard runs fn on its
    own streams (a kernel needs no other shard's rows); without one, fn itself."""
    mesh = current_mesh()
    s = spec(("streams",), jax.tree.leaves(args)[0].shape[:1], mesh)[0] if mesh is not None else None
    if s is None:
        return fn(*args)
    return jax.shard_map(fn, in_specs=jax.tree.map(lambda _: P(s), args), out_specs=P(s),
                         check_vma=False)(*args)


def moe_experts(fn: Callable, x, topk_ids, topk_weights, experts, valid=None):
    """fn(x [T,d], ids [T,k], weights [T,k], experts, valid [T,k] bool or None) -> [T,d] (the
    "moe_experts" op), expert-parallel under a mesh: every shard runs its own experts on its
    streams' tokens (a slot routed elsewhere is dropped there, as an invalid slot is everywhere)
    and a psum over the expert shards combines. Tokens are stream-major, so they shard like the
    streams."""
    mesh = current_mesh()
    num_experts = jax.tree.leaves(experts)[0].shape[0]
    eaxes = _single(spec(("experts",), (num_experts,), mesh)[0])
    tspec = spec(("streams", None), x.shape, mesh)
    if not eaxes and tspec[0] is None:
        return fn(x, topk_ids, topk_weights, experts, valid)
    n_local = num_experts // math.prod(dict(mesh.shape)[a] for a in eaxes)  # prod(()) = 1
    if valid is None:
        valid = jnp.ones(topk_ids.shape, bool)

    def local(xl, ids, w, ok, ex):
        if not eaxes:
            return fn(xl, ids, w, ex, ok)
        y = fn(xl, *_local_slots(ids, ok, eaxes, n_local, ex=ex, w=w))
        return jax.lax.psum(y, eaxes)

    espec = jax.tree.map(lambda _: P(eaxes or None), experts)
    return jax.shard_map(local, in_specs=(tspec, tspec, tspec, tspec, espec), out_specs=tspec,
                         check_vma=False)(
        x, topk_ids, topk_weights, valid, experts)


def _local_slots(ids, ok, eaxes: tuple[str, ...], n_local: int, *, ex, w):
    """An expert shard's view of its tokens' routing -> (ids relative to its first expert, w, ex,
    the slots it computes: valid and routed to one of its n_local experts); the others are dropped,
    so the shard's grouped GEMMs take only its own slots' rows and only the experts they hit."""
    rel = ids - _shard_offset(eaxes, n_local)
    mine = (rel >= 0) & (rel < n_local)
    return jnp.where(mine, rel, 0), w, ex, ok & mine


def moe_shard_work(topk_ids, valid, num_experts: int, block_m: int = 16):
    """The routed-expert work of each device's `moe_experts` shard under the current mesh, as its
    kernels' alignment lays it out (pallas_kernels.moe.align_routing of the shard's own slots):
    int32 [token shards, expert shards, 2] of (rows computed, distinct experts streamed).
    topk_ids [T, k] int32 and valid [T, k] bool (None: every slot) as `moe_experts` takes them."""
    from pallas_kernels.moe.align import align_routing

    mesh = current_mesh()
    eaxes = _single(spec(("experts",), (num_experts,), mesh)[0])
    tspec = spec(("streams", None), topk_ids.shape, mesh)
    n_local = num_experts // math.prod(dict(mesh.shape)[a] for a in eaxes) if eaxes else num_experts
    if valid is None:
        valid = jnp.ones(topk_ids.shape, bool)

    def local(ids, ok):
        if eaxes:
            ids, _, _, ok = _local_slots(ids, ok, eaxes, n_local, ex=None, w=None)
        routing = align_routing(ids, n_local, block_m, valid=ok)
        rows = jnp.sum(routing.row_slot < ids.size, dtype=jnp.int32)
        hit = jnp.any(routing.block_expert[None, :] == jnp.arange(n_local)[:, None], axis=1)
        return jnp.stack([rows, jnp.sum(hit, dtype=jnp.int32)])[None, None]

    if mesh is None:
        return local(topk_ids, valid)
    out = P(tspec[0], eaxes or None, None)
    return jax.shard_map(local, in_specs=(tspec, tspec), out_specs=out, check_vma=False)(topk_ids, valid)


def topk_logsumexp(fn: Callable, x, k: int):
    """fn(x [R,V], k) -> (values [R,k], indices [R,k], lse [R]) (the "topk_logsumexp" op).
    Vocabulary-parallel under a mesh: each shard takes the top-k of its slice and its logsumexp;
    the shards' candidates are all-gathered (R x k per shard, never R x V), and the top-k of those
    and the logsumexp of the shards' lse are the result. Ties keep the lower token id."""
    mesh = current_mesh()
    xspec = spec(("streams", "vocab"), x.shape, mesh)
    vocab = _single(xspec[1])
    if not vocab:
        return fn(x, k)
    rows = xspec[0]

    def local(xl):
        v, i, lse = fn(xl, min(k, xl.shape[1]))
        gather = lambda a: jax.lax.all_gather(a, vocab, axis=1, tiled=True)
        v, i = gather(v), gather(i + _shard_offset(vocab, xl.shape[1]))
        top, pos = jax.lax.top_k(v, k)   # candidates are in shard order: ties -> lower id
        return top, jnp.take_along_axis(i, pos, axis=1), jax.nn.logsumexp(gather(lse[:, None]), axis=1)

    return jax.shard_map(local, in_specs=(xspec,), out_specs=(P(rows, None), P(rows, None), P(rows)),
                         check_vma=False)(x)


# ---- multi-host ------------------------------------------------------------------------------

def define_distributed_flags() -> None:
    """absl flags --coordinator, --num_processes, --process_id for an entry point's module level."""
    flags.DEFINE_string("coordinator", None, "host:port of process 0 (multi-host runs only)")
    flags.DEFINE_integer("num_processes", None, "number of processes (hosts) in a multi-host run")
    flags.DEFINE_integer("process_id", None, "this process's index in [0, num_processes)")


def initialize_from_flags() -> bool:
    """maybe_initialize_distributed from the flags of `define_distributed_flags`."""
    f = flags.FLAGS
    return maybe_initialize_distributed(f.coordinator, f.num_processes, f.process_id)


def maybe_initialize_distributed(coordinator: str | None, num_processes: int | None,
                                 process_id: int | None) -> bool:
    """jax.distributed.initialize(coordinator, num_processes, process_id) when a coordinator
    address is given (several hosts); a no-op returning False otherwise. Call before any other
    JAX use; afterwards jax.devices() lists every host's devices."""
    if not coordinator:
        return False
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                               process_id=process_id)
    return True
