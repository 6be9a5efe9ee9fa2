"""The Kimi K2.6 verify step measured sharded over n devices (experiments/k2_step_bench.py, whose
docstring says what is measured and how): random params drawn into their shards, the engine's
stages and the verify's parts timed on each mesh, checked against a 1-way run, next to the roofline
projection and the memory plans."""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import time

import jax
import jax.numpy as jnp
import numpy as np

import ddtree_jax as dj
from ddtree_jax import engine
from ddtree_jax.atomic_io import write_json
from ddtree_jax.bench import memory_plan as mp
from ddtree_jax import model as tgt
from ddtree_jax.bench import calibration as calib
from ddtree_jax.bench import roofline as rf
from ddtree_jax import sharding
from ddtree_jax.bench import parity
from ddtree_jax.bench.timing import GpuClocks, markdown_table, median_seconds
from ddtree_jax.drafter import DrafterCache
from ddtree_jax.progress import track
from ddtree_jax.sampling import Sampling
from pallas_kernels.mla_attention import mla_attention
from pallas_kernels.moe import moe_experts


_STD = 0.02           # random weights' standard deviation (the model's init)
_NIBBLE_STD = 4.6     # std of a uniform nibble minus 8: INT4 scales of _STD / 4.6 give weights of std ~_STD
_HOST_BYTES = 1 << 20  # params smaller than this are drawn on the host (no compile per shape)


# ---- model and state -------------------------------------------------------------------------

def build_configs(preset: str, layers: int | None, int4: bool):
    """-> (the run's target config, its drafter config, the full preset's config and drafter)."""
    full = dj.ModelConfig.preset(preset)
    if int4:
        full = full.replace(quant=dj.QuantConfig("int4", 32))
    n = min(4, full.num_hidden_layers) if layers is None else layers
    if not 1 <= n <= full.num_hidden_layers:
        raise ValueError(f"--layers must lie in [1, {full.num_hidden_layers}] for preset {preset!r}, got {n}")
    cfg = mp.truncate(full, n)
    return cfg, dj.DrafterConfig.for_target(cfg), full, dj.DrafterConfig.for_target(full)


def _leaf_kind(path: str, leaf) -> str:
    if leaf.dtype == jnp.int32:
        return "bits"                                    # INT4 qweight words: uniform nibbles
    if path.endswith("_qscale"):
        return "qscale"
    if re.search(r"norm/scale$", path):
        return "ones"
    if path.endswith("e_score_correction_bias"):
        return "zeros"
    return "normal"


@functools.lru_cache(maxsize=None)
def _drawer(kind: str, shape: tuple, dtype, out_sharding):
    def draw(key):
        if kind == "bits":
            return jax.lax.bitcast_convert_type(jax.random.bits(key, shape, jnp.uint32), jnp.int32)
        if kind == "qscale":
            return (_STD / _NIBBLE_STD * jax.random.uniform(key, shape, jnp.float32, 0.5, 1.5)).astype(dtype)
        return _STD * jax.random.normal(key, shape, dtype)
    return jax.jit(draw, out_shardings=out_sharding)


def _host_draw(kind: str, shape: tuple, dtype, rng: np.random.Generator) -> np.ndarray:
    if kind == "bits":
        return rng.integers(-2 ** 31, 2 ** 31, shape, np.int32)
    if kind == "qscale":
        return (_STD / _NIBBLE_STD * rng.uniform(0.5, 1.5, shape)).astype(dtype)
    if kind in ("ones", "zeros"):
        return np.full(shape, kind == "ones", dtype)
    return (_STD * rng.standard_normal(shape, np.float32)).astype(dtype)


def random_params(shapes, mesh, seed: int):
    """Random params shaped like `shapes` (ShapeDtypeStructs), laid out by sharding.param_shardings:
    INT4 words uniform bits, group scales uniform in [0.5, 1.5] x _STD / 4.6, norm scales 1, the
    router's selection bias 0, every other leaf N(0, _STD). Random leaves of _HOST_BYTES or more are
    drawn on the devices straight into their shards (one small program per distinct kind, shape and
    sharding), so no device ever holds more than its shards; the rest come from the host, each
    device receiving only its slice (sharding.place)."""
    shardings = jax.tree.leaves(sharding.param_shardings(shapes, mesh))
    flat, tree = jax.tree_util.tree_flatten_with_path(shapes)
    key, rng = jax.random.key(seed), np.random.default_rng(seed)
    leaves = []
    for i, ((kp, x), s) in enumerate(zip(flat, shardings)):
        path = sharding.path_str(kp)
        kind = _leaf_kind(path, x)
        if kind in ("ones", "zeros") or x.size * x.dtype.itemsize < _HOST_BYTES:
            leaves.append(sharding.place(_host_draw(kind, x.shape, x.dtype, rng), path, mesh))
        else:
            leaves.append(_drawer(kind, x.shape, x.dtype, s)(jax.random.fold_in(key, i)))
    return jax.tree.unflatten(tree, leaves)


@functools.partial(jax.jit, static_argnames=("cfg", "dcfg", "streams", "max_len", "context", "dtype"))
def make_state(key, *, cfg, dcfg, streams: int, max_len: int, context: int, dtype) -> engine.EngineState:
    """An engine state of `streams` streams whose caches ([.., max_len, ..] slots, random entries)
    hold `context` tokens; laid out by the rules under the current mesh (engine.shard_state)."""
    keys = jax.random.split(key, cfg.num_hidden_layers + 4)
    kv = tuple(jax.random.normal(keys[i], (streams, max_len, cfg.latent_dim), dtype)
               for i in range(cfg.num_hidden_layers))
    lengths = jnp.full((streams,), context, jnp.int32)
    dshape = jax.eval_shape(lambda: dj.init_drafter_cache(dcfg, streams, max_len, dtype)).k.shape
    dcache = DrafterCache(jax.random.normal(keys[-4], dshape, dtype),
                          jax.random.normal(keys[-3], dshape, dtype), lengths)
    return engine.shard_state(engine.EngineState(
        tcache=dj.LatentCache(kv=kv, lengths=lengths), dcache=dcache,
        pending=jax.random.randint(keys[-2], (streams,), 0, cfg.vocab_size, jnp.int32),
        out_tokens=jnp.zeros((streams, dcfg.block_size + 1), jnp.int32),
        out_len=jnp.ones((streams,), jnp.int32), accept=jnp.zeros((streams, 1), jnp.int32),
        nodes=jnp.zeros((streams, 1), jnp.int32),
        done=jnp.zeros((streams,), bool), max_new=jnp.full((streams,), 2 ** 30, jnp.int32),
        step=jnp.zeros((), jnp.int32), key=keys[-1]))


# ---- the timed programs ------------------------------------------------------------------------

_draft = jax.jit(engine.stage_draft, static_argnames=("plan",))
_tree = jax.jit(engine.stage_tree, static_argnames=("plan",))


@functools.partial(jax.jit, static_argnames=("plan",), donate_argnames=("state",))
def _verify(tparams, state, tree, *, plan):
    """engine.stage_verify; the state comes back with the verify's cache writes (lengths unchanged)."""
    logits, cache, taps, tokens = engine.stage_verify(tparams, state, tree, plan)
    return logits, taps, tokens, state.replace(tcache=state.tcache.replace(kv=cache.kv))


@functools.partial(jax.jit, static_argnames=("plan",), donate_argnames=("state",))
def _accept(dparams, state, tree, logits, taps, tokens, *, plan):
    """engine.stage_accept on the verify's cache; lengths and counters are put back, so every call
    does the same work."""
    new = engine.stage_accept(dparams, state, tree, logits, state.tcache, taps, tokens, plan)
    return new.replace(tcache=new.tcache.replace(lengths=state.tcache.lengths),
                       dcache=new.dcache._replace(lengths=state.dcache.lengths), pending=state.pending,
                       out_len=state.out_len, done=state.done, step=state.step)


@functools.partial(jax.jit, static_argnames=("shape", "dtype", "logical"))
def _normal(key, *, shape, dtype, logical):
    return sharding.constrain(jax.random.normal(key, shape, dtype), logical)


@functools.partial(jax.jit, static_argnames=("cfg", "tokens", "dtype"))
def _routed_tokens(key, router, *, cfg, tokens: int, dtype):
    """Random MoE inputs x [T, d] and their routing by `router` (a layer's mlp/gate params)."""
    x = sharding.constrain(jax.random.normal(key, (tokens, cfg.hidden_size), dtype), ("streams", None))
    ids, w = tgt.route(tgt.router_logits(x, router["kernel"]), router["e_score_correction_bias"], cfg)
    return x, sharding.constrain(ids, ("streams", None)), sharding.constrain(w, ("streams", None))


@functools.partial(jax.jit, static_argnames=("cfg",))
def _attention_part(q, kv, lengths, node_mask, *, cfg):
    fn = functools.partial(mla_attention, scale=cfg.softmax_scale, v_dim=cfg.kv_lora_rank)
    return sharding.attention(fn, q, kv, lengths, node_mask)


@jax.jit
def _moe_part(x, ids, weights, experts):
    return sharding.moe_experts(moe_experts, x, ids, weights, experts)


@functools.partial(jax.jit, static_argnames=("cfg",))
def _dense_part(x, mlp, *, cfg):
    return tgt.SwiGLU(cfg.hidden_size, cfg.intermediate_size, x.dtype).apply({"params": mlp}, x)


@functools.partial(jax.jit, static_argnames=("streams",))
def _head_part(x, head, *, streams: int):
    x = x.reshape(streams, -1, x.shape[-1])
    logits = jnp.einsum("std,dv->stv", x, head.astype(x.dtype), preferred_element_type=jnp.float32)
    return sharding.constrain(logits, ("streams", None, "vocab"))


class _Programs:
    """Ahead-of-time compiles (lower + compile) and their seconds by program name."""

    def __init__(self):
        self.compile_s: dict[str, float] = {}
        self.count = 0

    def compile(self, name: str, fn, *args, **static):
        t0 = time.perf_counter()
        compiled = fn.lower(*args, **static).compile()
        self.compile_s[name] = self.compile_s.get(name, 0.0) + time.perf_counter() - t0
        self.count += 1
        return compiled


def _temp_bytes(compiled) -> int | None:
    stats = compiled.memory_analysis()
    return None if stats is None else int(stats.temp_size_in_bytes)


class _Chain:
    """A zero-argument call of compiled(*before, state, *after) whose returned state (its last
    output) is the next call's state, for programs that take the state donated."""

    def __init__(self, compiled, state, before=(), after=()):
        self.compiled, self.state, self.before, self.after = compiled, state, before, after
        self.out = None

    def __call__(self):
        self.out = self.compiled(*self.before, self.state, *self.after)
        self.state = self.out[-1] if isinstance(self.out, tuple) else self.out
        return self.out


# ---- one point -----------------------------------------------------------------------------------

def measure_point(progs: _Programs, tparams, dparams, state, draft_logits, cfg, dcfg, budget: int,
                  streams: int, key, reps: int, inner: int, parts: bool, ref=None,
                  clocks: GpuClocks | None = None):
    """Seconds per stage and per part at (budget, streams); -> (row of seconds, the latest state).
    ref: the 1-way run's (tree, verify logits) here (`reference_outputs`): the verify then runs on
    that tree, and its logits must match before anything after the tree is timed (the row's
    "logits_error" is their relative error). The row's "clocks": per timed stage or part, the SM
    clock and power-cap state of the mesh's GPUs over its timing (`GpuClocks.window`; {} without
    nvidia-smi)."""
    plan = engine.Plan(cfg, dcfg, "ddtree", budget, Sampling(), ())
    row, windows = {}, {}
    gpus = sorted(d.id for d in jax.tree.leaves(tparams)[0].sharding.device_set)   # this mesh's

    def time_of(name, fn, *args):     # row[name] = median seconds of fn(*args), its clock window kept
        t0 = time.time()
        row[name] = median_seconds(fn, *args, reps=reps, inner=inner)
        windows[name] = clocks.window(t0, time.time(), gpus) if clocks else {}

    active = ~state.done
    tree_c = progs.compile("tree", _tree, draft_logits, active, plan=plan)
    time_of("tree", tree_c, draft_logits, active)
    tree = tree_c(draft_logits, active)
    if ref is not None:   # the n-way draft may round a near-tie of the random drafter otherwise
        tree = jax.device_put(ref[0], jax.tree.map(lambda x: x.sharding, tree))

    verify_c = progs.compile("verify", _verify, tparams, state, tree, plan=plan)
    row["verify_temp_bytes"] = _temp_bytes(verify_c)
    chain = _Chain(verify_c, state, before=(tparams,), after=(tree,))
    if ref is not None:
        n = len(jax.tree.leaves(tparams)[0].sharding.device_set)
        row["logits_error"] = parity.check_sharded(
            f"{n}-way verify logits (budget {budget}, {streams} streams)", np.asarray(chain()[0]),
            ref[1], state.tcache.kv[0].dtype)
    time_of("verify", chain)
    logits, taps, tokens, state = chain.out

    accept_c = progs.compile("accept", _accept, dparams, state, tree, logits, taps, tokens, plan=plan)
    chain = _Chain(accept_c, state, before=(dparams,), after=(tree, logits, taps, tokens))
    time_of("accept", chain)
    state = chain.state
    if not parts:
        return dict(row, clocks=windows), state

    q_len = budget + 1
    k_attn, k_moe = jax.random.split(key)
    q = _normal(k_attn, shape=(streams, q_len, cfg.num_attention_heads, cfg.latent_dim),
                dtype=state.tcache.kv[0].dtype, logical=("streams", None, "heads", None))
    args = (q, state.tcache.kv[0], state.tcache.lengths, tree.node_mask)
    time_of("attention", progs.compile("attention", _attention_part, *args, cfg=cfg), *args)

    moe_layers = [i for i in range(cfg.num_hidden_layers) if cfg.is_moe_layer(i)]
    x = None
    if moe_layers:
        layer = tparams[f"layers_{moe_layers[0]}"]["mlp"]
        x, ids, w = _routed_tokens(k_moe, layer["gate"], cfg=cfg, tokens=streams * q_len,
                                   dtype=state.tcache.kv[0].dtype)
        args = (x, ids, w, layer["experts"])
        time_of("moe", progs.compile("moe", _moe_part, *args), *args)
    if x is None:
        x = _normal(k_moe, shape=(streams * q_len, cfg.hidden_size), dtype=state.tcache.kv[0].dtype,
                    logical=("streams", None))
    dense_layers = [i for i in range(cfg.num_hidden_layers) if not cfg.is_moe_layer(i)]
    if dense_layers:
        mlp = tparams[f"layers_{dense_layers[0]}"]["mlp"]
        time_of("dense", progs.compile("dense", _dense_part, x, mlp, cfg=cfg), x, mlp)
    head = tparams["lm_head"]["kernel"]
    time_of("head", progs.compile("head", _head_part, x, head, streams=streams), x, head)
    return dict(row, clocks=windows), state


# ---- projection, extrapolation, the row ---------------------------------------------------------

def projection(cfg, dcfg, gpus: int, context: int, streams: int, budget: int, gpu: str,
               calibration: str) -> dict:
    """Roofline seconds (all layers) of the verify and its parts, draft and tree."""
    st = rf.step_time(rf.GPUS[gpu], calib.calibrations()[calibration], rf.Deployment(cfg, dcfg, gpus, context),
                      streams, budget)
    return dict(verify=st.attention + st.moe + st.rest + st.comm + st.head, attention=st.attention,
                moe=st.moe, other=st.rest + st.comm, head=st.head, draft=st.draft, tree=st.tree)


def _layer_counts(cfg) -> tuple[int, int, int]:
    moe = sum(cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers))
    return cfg.num_hidden_layers, moe, cfg.num_hidden_layers - moe


def summarize(t: dict, cfg, full, proj: dict, proj_full: dict, proj_full_plan: dict) -> dict:
    """Measured seconds `t` (verify, stages, parts) -> the reported row in ms, with the projection's
    parts, the ratios measured / projected and the extrapolation to the full model."""
    n, n_moe, n_dense = _layer_counts(cfg)
    ms = lambda s: s * 1e3
    row = {f"{k}_ms": ms(v) for k, v in t.items() if k != "verify_temp_bytes"}
    row.update({f"proj_{k}_ms": ms(v) for k, v in proj.items()})
    row["verify_ratio"] = t["verify"] / proj["verify"]
    row["draft_ratio"] = t["draft"] / proj["draft"]
    row["tree_ratio"] = t["tree"] / proj["tree"]
    if "head" in t:
        attn, moe, dense = t["attention"], t.get("moe", 0.0), t.get("dense", 0.0)
        other = t["verify"] - n * attn - n_moe * moe - t["head"]     # dense MLP + rest, all layers
        rest = (other - n_dense * dense) / n
        row.update(rest_ms=ms(rest), other_layers_ms=ms(other),
                   attention_ratio=n * attn / proj["attention"], other_ratio=other / proj["other"],
                   head_ratio=t["head"] / proj["head"])
        if n_moe:
            row["moe_ratio"] = n_moe * moe / proj["moe"]
        f, f_moe, f_dense = _layer_counts(full)
        row["full_extrapolated_ms"] = ms(f * (attn + rest) + f_moe * moe + f_dense * dense + t["head"])
    row["full_projected_ms"] = ms(proj_full["verify"])
    row["full_projected_plan_devices_ms"] = ms(proj_full_plan["verify"])
    return row


# ---- main ----------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Options:
    """Everything a run takes (experiments/k2_step_bench.py's flags of the same names)."""

    preset: str = "kimi_k2_6"
    layers: int | None = None
    int4: bool = True
    devices: tuple[int, ...] = (1,)
    axis: str = "tensor"
    budgets: tuple[int, ...] = (16, 64, 256)
    streams: tuple[int, ...] = (1, 4, 16)
    context: int = 4096
    reps: int = 5
    inner: int = 3
    parts: bool = True
    dtype: str = "bfloat16"
    gpu: str = "H200"
    calibration: str = "measured"
    plan_devices: int = 8
    plan_device: str = "H200"
    time_limit_s: float = 0.0
    out: str = ""
    plan_only: bool = False
    progress: bool = True        # a bar per mesh on a terminal (ddtree_jax.progress)


TABLE = (("devices", "n"), ("budget", "B"), ("streams", "S"), ("tokens", "tokens"),
         ("verify_ms", "verify ms"), ("tokens_per_s", "verified tok/s"), ("attention_ms", "attn ms/layer"),
         ("moe_ms", "MoE ms/MoE layer"), ("rest_ms", "rest ms/layer"), ("head_ms", "head ms"),
         ("draft_ms", "draft ms"), ("tree_ms", "tree ms"), ("accept_ms", "accept ms"),
         ("proj_verify_ms", "projected verify ms"), ("verify_ratio", "measured/projected"),
         ("full_extrapolated_ms", "full: extrapolated ms"), ("full_projected_ms", "full: projected ms"),
         ("logits_error", "logits error vs 1-way"), ("verify_sm_mhz", "SM MHz (verify)"))


def _mhz(window: dict) -> int | None:
    """A GpuClocks window's median SM clock as whole MHz (None without samples)."""
    return None if "sm_mhz" not in window else round(window["sm_mhz"])


def _plan_table(plans) -> str:
    """Markdown table of memory plans, without the columns that are zero in every row."""
    rows = [p.row() for p in plans]
    cols = [c for c in mp.PLAN_COLUMNS if c == "mesh" or any(r[c] not in (0, 0.0) for r in rows)]
    return markdown_table(rows, cols, [c.removesuffix("_gb") + " GB" * c.endswith("_gb") for c in cols])


def _device_memory() -> dict:
    stats = jax.local_devices()[0].memory_stats() or {}
    return {k: stats[k] for k in ("bytes_limit", "peak_bytes_in_use") if k in stats}


def parse_ints(name: str, values) -> tuple[int, ...]:
    """A flag's list of positive ints (ValueError naming --name otherwise)."""
    try:
        out = tuple(int(v) for v in values)
    except ValueError as e:
        raise ValueError(f"--{name} must be a list of ints, got {values}") from e
    if not out or min(out) < 1:
        raise ValueError(f"--{name} must be positive ints, got {values}")
    return out


def _print_full_plans(o: Options, full, dfull, work: mp.Workload, result: dict) -> None:
    plans = mp.plans_for(full, dfull, o.plan_devices, work, o.plan_device)
    fit = mp.smallest_fit(full, dfull, work, o.plan_device)
    result["memory"].update(full_plans=[p.row() for p in plans],
                            full_smallest_fit=None if fit is None else fit.row())
    print(f"Memory plan, full {o.preset} ({full.num_hidden_layers} layers) on {o.plan_devices} x "
          f"{o.plan_device} (S={work.streams}, B={work.budget}, context {work.context}; GB = 1e9 B per "
          f"device):\n{_plan_table(plans)}")
    print("smallest fitting: " + ("none" if fit is None else
                                  f"{math.prod(fit.mesh)} devices, mesh {fit.mesh}") + "\n")


def _print_run_plan(o: Options, n: int, cfg, dcfg, full, work: mp.Workload, result: dict) -> tuple:
    """Print and record the memory plan of this run on n devices along o.axis; -> the mesh shape."""
    shape = tuple(n if a == o.axis else 1 for a in sharding.AXES)
    p = mp.plan(cfg, dcfg, shape, work, o.plan_device)
    result["memory"][f"run_plan_{n}"] = p.row()
    print(f"\nMemory plan of this run ({cfg.num_hidden_layers} layers) on mesh {shape} (device bytes_limit "
          f"{_device_memory().get('bytes_limit', 'n/a')}; layers of the full model that would fit: "
          f"{mp.max_layers(full, shape, work, o.plan_device)}):\n{_plan_table([p])}", flush=True)
    return shape


def reference_outputs(o: Options, cfg, dcfg, work: mp.Workload) -> dict:
    """(streams, budget) -> the 1-way run's tree and verify logits (host arrays), untimed: the
    same params, state and draft as `_measure_mesh` on one device."""
    mesh = sharding.make_mesh((1,) * len(sharding.AXES))
    tparams = random_params(mp.target_shapes(cfg, o.dtype), mesh, seed=1)
    dparams = random_params(mp.drafter_shapes(dcfg, o.dtype), mesh, seed=2)
    key, out = jax.random.key(0), {}
    with jax.set_mesh(mesh):
        for s in o.streams:
            state = make_state(key, cfg=cfg, dcfg=dcfg, streams=s, max_len=work.max_len,
                               context=o.context, dtype=jnp.dtype(o.dtype))
            draft_logits = _draft(tparams, dparams, state,
                                  plan=engine.Plan(cfg, dcfg, "ddtree", 1, Sampling(), ()))
            for b in o.budgets:
                plan = engine.Plan(cfg, dcfg, "ddtree", b, Sampling(), ())
                tree = _tree(draft_logits, ~state.done, plan=plan)
                logits, _, _, state = _verify(tparams, state, tree, plan=plan)
                out[(s, b)] = (jax.tree.map(np.asarray, tree), np.asarray(logits))
    return out


def _measure_mesh(o: Options, n: int, cfg, dcfg, full, dfull, work: mp.Workload, result: dict,
                  write, out_of_time, reference: dict | None, clocks: GpuClocks | None = None) -> None:
    """Every (streams, budget) point on the mesh of the first n devices; n > 1 with a
    `reference_outputs`: each point's verify is checked against it before it is timed. clocks:
    each point's SM clock windows (`measure_point`)."""
    shape = _print_run_plan(o, n, cfg, dcfg, full, work, result)
    mesh = sharding.make_mesh(shape)
    progs, key = _Programs(), jax.random.key(0)
    t0 = time.perf_counter()
    tparams = random_params(mp.target_shapes(cfg, o.dtype), mesh, seed=1)
    dparams = random_params(mp.drafter_shapes(dcfg, o.dtype), mesh, seed=2)
    jax.block_until_ready((tparams, dparams))
    init_s = time.perf_counter() - t0
    with jax.set_mesh(mesh):
        for s in track(o.streams, f"{n} devices", o.progress):
            if out_of_time():
                result["skipped"] += [dict(devices=n, budget=b, streams=s) for b in o.budgets]
                continue
            state = progs.compile("state", make_state, key, cfg=cfg, dcfg=dcfg, streams=s,
                                  max_len=work.max_len, context=o.context, dtype=jnp.dtype(o.dtype))(key)
            draft_c = progs.compile("draft", _draft, tparams, dparams, state,
                                    plan=engine.Plan(cfg, dcfg, "ddtree", 1, Sampling(), ()))
            t_draft = median_seconds(draft_c, tparams, dparams, state, reps=o.reps, inner=o.inner)
            draft_logits = draft_c(tparams, dparams, state)
            for b in o.budgets:
                if out_of_time():
                    result["skipped"].append(dict(devices=n, budget=b, streams=s))
                    continue
                ref = reference[(s, b)] if reference and n > 1 else None
                t, state = measure_point(progs, tparams, dparams, state, draft_logits, cfg, dcfg, b, s,
                                         jax.random.fold_in(key, 1000 * s + b), o.reps, o.inner, o.parts,
                                         ref, clocks)
                err = t.pop("logits_error", None)
                windows = t.pop("clocks")
                t["draft"] = t_draft
                proj = lambda c, d, g: projection(c, d, g, o.context, s, b, o.gpu, o.calibration)
                act = mp.activation_bytes(cfg, dcfg, dataclasses.replace(work, streams=s, budget=b),
                                          mp.abstract_mesh(shape))["peak"]
                row = dict(devices=n, mesh=shape, budget=b, streams=s, tokens=s * (b + 1),
                           tokens_per_s=s * (b + 1) / t["verify"], verify_temp_bytes=t["verify_temp_bytes"],
                           plan_activation_bytes=act, logits_error=err, clocks=windows,
                           verify_sm_mhz=_mhz(windows["verify"]),
                           verify_power_capped=windows["verify"].get("power_capped"))
                row.update(summarize(t, cfg, full, proj(cfg, dcfg, n), proj(full, dfull, n),
                                     proj(full, dfull, o.plan_devices)))
                result["points"].append(row)
                temp = row["verify_temp_bytes"]
                print(f"n={n} B={b} S={s}: verify {row['verify_ms']:.3f} ms, {row['tokens_per_s']:.0f} "
                      f"verified tok/s, projected {row['proj_verify_ms']:.3f} ms "
                      f"(x{row['verify_ratio']:.2f}); verify's XLA temp "
                      f"{'n/a' if temp is None else f'{temp / 1e9:.3g}'} GB, plan's activations "
                      f"{act / 1e9:.3g} GB", flush=True)
                write()
    result["memory"][f"device_{n}"] = dict(_device_memory(), note="peak over the process so far")
    result["compile_s"][str(n)] = dict(progs.compile_s, programs=progs.count, param_init_s=init_s)
    print(f"n={n}: {progs.count} programs compiled in {sum(progs.compile_s.values()):.1f} s "
          f"({', '.join(f'{k} {v:.1f}' for k, v in progs.compile_s.items())}); random params in "
          f"{init_s:.1f} s; device memory {result['memory'][f'device_{n}']}", flush=True)


def run(o: Options) -> dict:
    """The whole benchmark; returns (and writes to o.out after every point) the JSON-able result."""
    t_start = time.perf_counter()
    cfg, dcfg, full, dfull = build_configs(o.preset, o.layers, o.int4)
    if max(o.devices) > jax.device_count() and not o.plan_only:
        raise ValueError(f"--devices {list(o.devices)} exceeds the {jax.device_count()} devices present")
    if o.reps < 1 or o.inner < 1:
        raise ValueError(f"--reps and --inner must be >= 1, got {o.reps}, {o.inner}")
    work = mp.Workload(max(o.streams), o.context, max(o.budgets), o.dtype)
    result = dict(options=dataclasses.asdict(o), layers=cfg.num_hidden_layers,
                  full_layers=full.num_hidden_layers, experts=cfg.quant.format,
                  device_kind=jax.devices()[0].device_kind, jax_version=jax.__version__,
                  backend=jax.default_backend(), date=time.strftime("%Y-%m-%d"), points=[], skipped=[],
                  memory={}, compile_s={})

    def write():
        if o.out:
            write_json(o.out, result, indent=1, default=str)

    out_of_time = lambda: bool(o.time_limit_s) and time.perf_counter() - t_start > o.time_limit_s
    _print_full_plans(o, full, dfull, work, result)
    if o.plan_only:
        for n in o.devices:
            _print_run_plan(o, n, cfg, dcfg, full, work, result)
        write()
        return result
    _, n_moe, n_dense = _layer_counts(cfg)
    per_point = ["tree", "verify", "accept"] + (
        ["attention"] + ["MoE"] * bool(n_moe) + ["dense MLP"] * bool(n_dense) + ["head"] if o.parts else [])
    n_points = len(o.devices) * len(o.budgets) * len(o.streams)
    print(f"{o.preset}, {cfg.num_hidden_layers} of {full.num_hidden_layers} layers, {cfg.quant.format} "
          f"experts, {o.dtype}, on {jax.device_count()} x {result['device_kind']} (jax {jax.__version__}), "
          f"mesh axis {o.axis!r}, context {o.context}, cache slots {work.max_len}\n"
          f"programs to compile: {n_points * len(per_point) + 2 * len(o.devices) * len(o.streams)} "
          f"({len(per_point)} per point: {', '.join(per_point)}; 2 per (n, S): state, draft), plus small "
          f"input and random-parameter programs", flush=True)
    reference = None
    if max(o.devices) > 1:
        if mp.plan(cfg, dcfg, (1,) * len(sharding.AXES), work, o.plan_device).fits:
            t0 = time.perf_counter()
            reference = reference_outputs(o, cfg, dcfg, work)
            result["logits_check"] = (f"n-way verify logits against the 1-way run's, relative error "
                                      f"<= {parity.SHARDED_TOL[o.dtype]:g}")
            print(f"1-way reference (trees, verify logits) in {time.perf_counter() - t0:.1f} s", flush=True)
        else:
            result["logits_check"] = f"none: the 1-way run does not fit one {o.plan_device}"
        print(f"check: {result['logits_check']}", flush=True)
    with GpuClocks() as clocks:     # nvidia-smi samples every GPU; each mesh's windows read its own
        for n in o.devices:
            _measure_mesh(o, n, cfg, dcfg, full, dfull, work, result, write, out_of_time, reference, clocks)
    result["wall_s"] = time.perf_counter() - t_start
    write()
    f = full.num_hidden_layers
    print(f"\nPer point, ms (attention and rest per layer, MoE per MoE layer); {result['wall_s']:.0f} s "
          f"in all. "
          f"Projection: roofline {o.gpu}/{o.calibration} for {cfg.num_hidden_layers} layers on n GPUs"
          + (" (it models the 'tensor' layout, not this run's)" if o.axis != "tensor" else "") +
          f". 'full: extrapolated' is an EXTRAPOLATION to {f} layers from the measured parts, not a "
          f"measurement; 'full: projected' is the roofline for {f} layers on n GPUs.")
    if result["skipped"]:
        print(f"skipped after --time_limit_s={o.time_limit_s}: {result['skipped']}")
    print(markdown_table(result["points"], [c for c, _ in TABLE], [h for _, h in TABLE]))
    return result
