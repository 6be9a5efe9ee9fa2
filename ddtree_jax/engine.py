"""The multi-stream speculative decoding engine: `generate` with methods "ar", "dflash", "ddtree".

Per step, entirely on the device (one jitted function, state buffers donated):
  draft   the DFlash drafter reads [pending, MASK x (B-1)] against its context cache -> draft logits
          for depths 1..B-1;
  tree    "ddtree": the `budget` best prefixes (build_tree); "dflash": the greedy chain;
  verify  one target forward over [root + nodes] per stream, position = start + depth, ancestor-only
          visibility, tapping the drafter's layers;
  accept  the target's own choice at every node (greedy or sampled), the walk from the root
          (follow_tree), stop tokens and max_new_tokens;
  compact the accepted nodes' latent-cache entries move to contiguous slots and their taps join the
          drafter's context; rejected entries are dropped by the lengths.
Under `jax.set_mesh(mesh)` (ddtree_jax.sharding) the same step runs sharded and `shard_state` keeps
the state's layout from step to step. A decode runs either on the device (`_decode_on_device`: one
call, the device checks every few steps whether a stream has tokens left) or from the host
(`decode`: the host reads how many tokens each stream has left, a few steps behind the device
without making it wait, and stops dispatching once the steps in flight should finish every
stream; for ar without stop tokens it dispatches the known steps and reads nothing). Either way
the compiled call keeps its state in the same device buffers from decode to decode
(`CompiledDecode.load`), so XLA's CUDA graphs are replayed, not recorded again.
Stage times come from the same stage functions jitted one by one and timed on a copy of the
prefilled state. docs/engine.md explains the loops, the buffers and the measurements behind them.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import time
import warnings
from typing import Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from ddtree_jax import drafter as dft
from ddtree_jax import model as tgt
from ddtree_jax import sharding
from ddtree_jax import tree as trees
from ddtree_jax.checks import check_int, integer_array
from ddtree_jax.config import DrafterConfig, ModelConfig
from ddtree_jax.sampling import Sampling, choose
from pallas_kernels import registry
from pallas_kernels.tree_accept import tree_accept

METHODS = ("ar", "dflash", "ddtree")
DECODE_LOOPS = ("auto", "host", "device")


@flax.struct.dataclass
class EngineState:
    """Everything a step reads and writes, one row per stream (S streams)."""

    tcache: tgt.LatentCache      # committed tokens (all emitted tokens but the pending one)
    dcache: dft.DrafterCache | None
    pending: jnp.ndarray         # [S] int32 last emitted token, not yet through the target
    out_tokens: jnp.ndarray      # [S, max_new + block] int32 emitted tokens
    out_len: jnp.ndarray         # [S] int32
    accept: jnp.ndarray          # [S, max_steps] int32 acceptance length per step (0: inactive)
    done: jnp.ndarray            # [S] bool
    max_new: jnp.ndarray         # [S] int32
    step: jnp.ndarray            # [] int32
    key: jnp.ndarray             # PRNG key


@dataclasses.dataclass(frozen=True)
class Plan:
    """Static description of one generate call (hashable: a jit static argument)."""

    tcfg: ModelConfig
    dcfg: DrafterConfig | None
    method: str
    budget: int
    sampling: Sampling
    stop_tokens: tuple[int, ...]
    attn_impl: str = "auto"
    moe_impl: str = "auto"
    topk_impl: str = "auto"
    drafter_attn_impl: str = "auto"
    attn_balance: bool = True    # the target attention's hint for ragged stream lengths (model.forward)

    @property
    def nodes(self) -> int:
        """Verified tokens per stream per step (root included)."""
        return {"ar": 1, "dflash": self.dcfg.block_size if self.dcfg else 1,
                "ddtree": self.budget + 1}[self.method]

    @property
    def max_depth(self) -> int:
        return 0 if self.method == "ar" else self.dcfg.block_size - 1


@dataclasses.dataclass
class GenerateResult:
    tokens: list                 # per stream: generated ids
    acceptance_lengths: list     # per stream: tokens emitted by each step before truncation
    tau: float                   # mean acceptance length over all (stream, step) pairs
    tokens_per_second: float     # generated tokens / decode wall time (compile, warm-up excluded)
    stage_times: dict            # seconds per step: draft, tree, verify, accept (+ step total)
    steps: int
    prefill_seconds: float
    decode_seconds: float
    compile_seconds: float
    request_seconds: list | None = None   # `serve` only: per request, admission to its result
    device_steps: int = 0        # steps the device ran, including those after every stream was done
    decode_loop: str = ""        # the loop that ran the decode: "host" or "device" (`decode_loop_for`)


def shard_state(state: EngineState) -> EngineState:
    """Pin the state's layout under a mesh (streams over "data", caches by their rules), so every
    step returns the state laid out as it took it; the identity without a mesh."""
    streams = lambda x: sharding.constrain(x, ("streams",) + (None,) * (x.ndim - 1))
    tcache = tgt.LatentCache(kv=tuple(sharding.constrain(k, sharding.LATENT_CACHE)
                                      for k in state.tcache.kv),
                             lengths=streams(state.tcache.lengths))
    dcache = state.dcache
    if dcache is not None:
        dcache = dft.DrafterCache(*(sharding.constrain(c, sharding.DRAFTER_CACHE) for c in dcache[:2]),
                                  streams(dcache.lengths))
    return state.replace(tcache=tcache, dcache=dcache, pending=streams(state.pending),
                         out_tokens=streams(state.out_tokens), out_len=streams(state.out_len),
                         accept=streams(state.accept), done=streams(state.done),
                         max_new=streams(state.max_new))


# ---- stages ----------------------------------------------------------------------------------

def stage_draft(tparams, dparams, state: EngineState, plan: Plan):
    """-> draft logits [S, B-1, V] float32 for depths 1..B-1."""
    emb = dft.block_embedding(tparams, plan.dcfg, state.pending)
    pos = state.tcache.lengths[:, None] + jnp.arange(plan.dcfg.block_size, dtype=jnp.int32)
    hidden = dft.draft_block(dparams, plan.dcfg, state.dcache, emb, pos,
                             attn_impl=plan.drafter_attn_impl)
    return dft.draft_logits(tparams, hidden[:, 1:])


def stage_tree(draft_logits, plan: Plan) -> trees.Tree:
    if plan.method == "ddtree":
        return trees.build_tree(draft_logits, plan.budget, topk_impl=plan.topk_impl)
    return chain_tree(draft_logits)


def chain_tree(draft_logits) -> trees.Tree:
    """The DFlash chain as a Tree: the drafter's greedy token at each depth 1..D, node i's parent i-1."""
    s, d, _ = draft_logits.shape
    logp = jax.nn.log_softmax(draft_logits.astype(jnp.float32), axis=-1)
    tokens = jnp.argmax(logp, axis=-1).astype(jnp.int32)
    depths = jnp.broadcast_to(jnp.arange(1, d + 1, dtype=jnp.int32), (s, d))
    parents = jnp.broadcast_to(jnp.arange(-1, d, dtype=jnp.int32), (s, d + 1))
    vis = jnp.broadcast_to(jnp.tril(jnp.ones((d + 1, d + 1), bool)), (s, d + 1, d + 1))
    scores = jnp.cumsum(jnp.take_along_axis(logp, tokens[..., None], axis=-1)[..., 0], axis=1)
    return trees.Tree(tokens=tokens, depths=depths, parents=parents,
                      num_nodes=jnp.full((s,), d, jnp.int32), visibility=vis,
                      node_mask=trees.pack_bits(vis), scores=scores, max_depth=d)


def stage_verify(tparams, state: EngineState, tree: trees.Tree | None, plan: Plan):
    """One target forward over [root + nodes]; -> (logits [S, N, V], cache, taps [S, N, taps*d],
    tokens [S, N] int32: the verified tokens, root first)."""
    root = state.pending[:, None]
    if tree is None:
        tokens, depth, vis = root, jnp.zeros_like(root), None
    else:
        tokens = jnp.concatenate([root, tree.tokens], axis=1)
        depth = jnp.concatenate([jnp.zeros_like(root), tree.depths], axis=1)
        vis = tree.visibility
    taps = plan.dcfg.target_layer_ids if plan.dcfg is not None and plan.method != "ar" else ()
    out = tgt.forward(tparams, plan.tcfg, tokens, state.tcache.lengths[:, None] + depth, state.tcache,
                      visibility=vis, taps=taps, attn_impl=plan.attn_impl, moe_impl=plan.moe_impl,
                      attn_balance=plan.attn_balance)
    return out.logits, out.cache, out.taps, tokens


def stage_accept(dparams, state: EngineState, tree, logits, cache, taps, tokens, plan: Plan):
    """Target choice per node, the walk, emission, stop handling, compaction -> new state."""
    key, sub = jax.random.split(state.key)
    posterior = choose(logits, sub, plan.sampling)                                  # [S, N]
    s = tokens.shape[0]
    start = state.tcache.lengths
    active = ~state.done
    if tree is None:                                                                # "ar"
        acc_len, bonus, path_tokens = jnp.ones((s,), jnp.int32), posterior[:, 0], tokens
        kv = cache.kv   # its one node already sits at slot start: nothing moves
    else:   # the walk and the compaction of the accepted nodes' cache entries ("tree_accept")
        _, acc_len, bonus, path_tokens, kv, path_taps = sharding.per_stream(
            functools.partial(tree_accept, impl=plan.topk_impl), tree, tokens, posterior, start,
            active, cache.kv, taps)
    depth = path_tokens.shape[1]
    j = jnp.arange(depth, dtype=jnp.int32)[None, :]
    nxt = jnp.concatenate([path_tokens[:, 1:], jnp.zeros((s, 1), jnp.int32)], axis=1)
    emit = jnp.where(j < acc_len[:, None] - 1, nxt, bonus[:, None])              # [S, D+1]

    # stop tokens and max_new_tokens truncate this step's emission
    n_emit = jnp.minimum(acc_len, state.max_new - state.out_len)
    hit_stop = jnp.zeros_like(state.done)
    if plan.stop_tokens:
        is_stop = jnp.isin(emit, jnp.asarray(plan.stop_tokens, jnp.int32)) & (j < n_emit[:, None])
        first = jnp.argmax(is_stop, axis=1)
        hit_stop = is_stop.any(axis=1)
        n_emit = jnp.where(hit_stop, first + 1, n_emit)
    n_emit = jnp.where(active, n_emit, 0)
    slot = jnp.where(j < n_emit[:, None], state.out_len[:, None] + j, state.out_tokens.shape[1])
    rows = jnp.arange(s)[:, None]
    out_tokens = state.out_tokens.at[rows, slot].set(emit, mode="drop")
    out_len = state.out_len + n_emit
    done = state.done | hit_stop | (out_len >= state.max_new)

    keep = jnp.where(active, acc_len, 0)
    dcache = state.dcache
    if tree is not None:
        dcache = dft.append_context(dparams, plan.dcfg, dcache, path_taps, start[:, None] + j, keep,
                                    attn_impl=plan.drafter_attn_impl)
    tcache = tgt.LatentCache(kv=kv, lengths=start + keep)
    accept = state.accept.at[:, state.step].set(jnp.where(active, acc_len, 0), mode="drop")
    return shard_state(EngineState(
        tcache=tcache, dcache=dcache, pending=jnp.where(active, bonus, state.pending),
        out_tokens=out_tokens, out_len=out_len, accept=accept, done=done, max_new=state.max_new,
        step=state.step + 1, key=key))


def speculative_step(tparams, dparams, state: EngineState, plan: Plan) -> EngineState:
    """draft -> tree -> verify -> accept -> compact, for every stream at once. Each stage runs in
    a named scope of its own ("draft", "tree", "verify", "accept"), which the compiled HLO keeps in
    its ops' metadata: experiments/step_profile.py splits a traced step's kernels by it."""
    tree = None
    if plan.method != "ar":
        with jax.named_scope("draft"):
            draft_logits = stage_draft(tparams, dparams, state, plan)
        with jax.named_scope("tree"):
            tree = stage_tree(draft_logits, plan)
    with jax.named_scope("verify"):
        logits, cache, taps, tokens = stage_verify(tparams, state, tree, plan)
    with jax.named_scope("accept"):
        return stage_accept(dparams, state, tree, logits, cache, taps, tokens, plan)


def _step_and_flag(tparams, dparams, state: EngineState, plan: Plan, steps: int = 1):
    """`steps` steps -> (new state, left [S] int32: tokens each stream has still to emit, 0 once
    it is done): `left` is its own small buffer, so the host can read it after the state has been
    donated to the next call. Several steps run in a fixed-count loop on the device (no host round
    trip between them, one dispatch for all); steps after a stream is done leave it unchanged."""
    if steps == 1:
        state = speculative_step(tparams, dparams, state, plan)
    else:
        state = jax.lax.fori_loop(0, steps, lambda _, s: speculative_step(tparams, dparams, s, plan),
                                  state)
    return state, tokens_left(state)


def tokens_left(state: EngineState) -> jnp.ndarray:
    """[S] int32: tokens each stream may still emit (max_new_tokens - emitted), 0 once it is done."""
    return jnp.where(state.done, 0, state.max_new - state.out_len).astype(jnp.int32)


# The jitted function keeps its traced name (HLO op metadata, profiles: "jit(_step_and_flag)/...").
decode_steps = jax.jit(_step_and_flag, static_argnames=("plan", "steps"), donate_argnames=("state",))
decode_steps.__doc__ = """decode_steps(tparams, dparams, state, plan, steps=1)
    -> (state, left [S] int32): the host loop's call (`decode`; `compile_decode` compiles it for
"host"): `steps` speculative steps for all S streams, jitted, `state` (an EngineState, `prefill`'s
or `initial_state`'s) donated, plan and steps static. left: tokens each stream has still to emit,
0 once it is done, a buffer of its own that the host can read after the state has been donated to
the next call. `steps` > 1 runs them in a fixed-count device loop (no host round trip between them,
one dispatch for all); steps after a stream is done leave it unchanged."""


def _decode_on_device(tparams, dparams, state: EngineState, plan: Plan, steps: int, max_iters: int):
    """A whole decode as one call -> the final state: `steps`-step loops (as `decode_steps`)
    repeated while some stream has tokens left, at most `max_iters` times. The device checks the
    counts itself every `steps` steps, so there is one dispatch per decode and at most `steps` - 1
    steps run after the last stream is done; each check is a data-dependent loop condition, which
    XLA reads back on the host unless while loops are recorded into CUDA graphs."""
    def more(carry):
        s, i = carry
        return (i < max_iters) & jnp.any(tokens_left(s) > 0)

    def body(carry):
        s, i = carry
        return _step_and_flag(tparams, dparams, s, plan, steps)[0], i + 1

    state, _ = jax.lax.while_loop(more, body, (state, jnp.zeros((), jnp.int32)))
    return state


_decode_all = jax.jit(_decode_on_device, static_argnames=("plan", "steps", "max_iters"),
                      donate_argnames=("state",))


# ---- prefill -----------------------------------------------------------------------------------

def _prefill_state(tparams, dparams, tokens, lengths, max_new, key, plan: Plan, max_len: int,
                   max_out: int, max_steps: int) -> EngineState:
    """Run the prompts (padded [S, P], true lengths [S]) and choose each stream's first token."""
    s, p = tokens.shape
    dtype = jax.tree_util.tree_leaves(tparams["embed_tokens"])[0].dtype
    cache = tgt.init_cache(plan.tcfg, s, max_len, dtype)
    use_drafter = plan.method != "ar"
    taps = plan.dcfg.target_layer_ids if use_drafter else ()
    positions = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (s, p))
    out = tgt.forward(tparams, plan.tcfg, tokens, positions, cache, num_new=lengths, taps=taps,
                      attn_impl=plan.attn_impl, moe_impl=plan.moe_impl, attn_balance=plan.attn_balance)
    key, sub = jax.random.split(key)
    last = jnp.take_along_axis(out.logits, (lengths - 1)[:, None, None], axis=1)[:, 0]
    first = choose(last, sub, plan.sampling)
    dcache = None
    if use_drafter:
        dcache = dft.init_drafter_cache(plan.dcfg, s, max_len, dtype)
        dcache = dft.append_context(dparams, plan.dcfg, dcache, out.taps, positions, lengths,
                                    attn_impl=plan.drafter_attn_impl)
    out_tokens = jnp.zeros((s, max_out), jnp.int32).at[:, 0].set(first)
    done = (max_new <= 1)
    if plan.stop_tokens:
        done = done | jnp.isin(first, jnp.asarray(plan.stop_tokens, jnp.int32))
    return shard_state(EngineState(
        tcache=out.cache, dcache=dcache, pending=first, out_tokens=out_tokens,
        out_len=jnp.ones((s,), jnp.int32), accept=jnp.zeros((s, max_steps), jnp.int32), done=done,
        max_new=max_new, step=jnp.zeros((), jnp.int32), key=key))


_PREFILL_STATIC = ("plan", "max_len", "max_out", "max_steps")
initial_state = jax.jit(_prefill_state, static_argnames=_PREFILL_STATIC)
initial_state.__doc__ = """initial_state(tparams, dparams, tokens [S, P] int32, lengths [S] int32,
    max_new [S] int32, key, plan, max_len, max_out, max_steps) -> EngineState: the decode's starting
state, jitted (plan and the sizes static): the zero-padded prompts `tokens` (true lengths `lengths`)
through the target, the drafter's context appended (not for ar), each stream's first token chosen
with `key`; the target cache has `max_len` slots per stream, out_tokens [S, max_out], accept
[S, max_steps]. `prefill` calls it with a Setup's arrays and key(seed); call it directly for other
arrays, sizes or keys, or inside another jitted function (serving's admission)."""


@functools.partial(jax.jit, static_argnames=_PREFILL_STATIC, donate_argnames=("buffers",),
                   keep_unused=True)
def _prefill_into(buffers: EngineState, tparams, dparams, tokens, lengths, max_new, key, plan: Plan,
                  max_len: int, max_out: int, max_steps: int) -> EngineState:
    """`initial_state` with its state written into `buffers` (donated, same shapes and layout)."""
    del buffers   # only donated: XLA writes the outputs into them
    return _prefill_state(tparams, dparams, tokens, lengths, max_new, key, plan, max_len, max_out,
                          max_steps)


# ---- the public entry point --------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Setup:
    """A validated generate call: the static plan and the host-side padded inputs."""

    plan: Plan
    prompts: np.ndarray      # [S, P] int32, zero-padded
    lengths: np.ndarray      # [S] int32
    max_new: np.ndarray      # [S] int32
    max_len: int             # target cache slots per stream
    max_out: int             # output buffer width
    max_steps: int


def setup(target, drafter, prompts, *, method="ddtree", budget=64, max_new_tokens=64,
          temperature=0.0, top_k=0, top_p=1.0, stop_tokens=(), max_len=None, attn_impl="auto",
          moe_impl="auto", topk_impl="auto", drafter_attn_impl="auto", attn_balance=True) -> Setup:
    """Validate a generate call (see `generate`) and lay out its inputs."""
    tcfg = target[0]
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    dcfg = drafter[0] if (drafter is not None and method != "ar") else None
    if method != "ar":
        if dcfg is None:
            raise ValueError(f"method {method!r} needs a drafter (config, params)")
        dcfg.check_target(tcfg)
    if method == "ddtree":
        check_int("budget", budget, 1)
    try:
        registry.resolve("drafter_attention", drafter_attn_impl)
    except ValueError as e:
        raise ValueError(f"drafter_attn_impl: {e}") from None
    plan = Plan(tcfg, dcfg, method, int(budget) if method == "ddtree" else 0,
                Sampling(temperature, top_k, top_p), _stop_tokens(stop_tokens),
                attn_impl, moe_impl, topk_impl, drafter_attn_impl, bool(attn_balance))
    lengths = np.array([len(p) for p in prompts], np.int32)
    if len(prompts) == 0 or np.any(lengths == 0):
        raise ValueError("prompts must be a non-empty list of non-empty token lists")
    max_new = integer_array("max_new_tokens", max_new_tokens)
    if max_new.shape not in ((), lengths.shape):
        raise ValueError(f"max_new_tokens must be one int or one per prompt ({len(prompts)}), "
                         f"got shape {max_new.shape}")
    max_new = np.broadcast_to(max_new, lengths.shape).astype(np.int32)
    if np.any(max_new < 1):
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new.tolist()}")
    padded = np.zeros((len(prompts), lengths.max()), np.int32)
    for i, p in enumerate(prompts):
        p = integer_array(f"prompts[{i}]", p)
        if p.ndim != 1:
            raise ValueError(f"prompts[{i}] must be a list of token ids, got shape {p.shape}")
        padded[i, :len(p)] = p
    if padded.min() < 0 or padded.max() >= tcfg.vocab_size:
        raise ValueError(f"prompt token ids must lie in [0, {tcfg.vocab_size})")
    needed = int((lengths + max_new).max()) + plan.nodes
    if max_len is None:
        max_len = tgt.aligned_slots(needed)
    elif needed > max_len:
        raise ValueError(f"prompts longer than the cache: longest prompt + max_new_tokens + "
                         f"{plan.nodes} verify slots = {needed} > max_len = {max_len}")
    if int((lengths + max_new).max()) > tcfg.max_position_embeddings:
        raise ValueError(f"prompt + max_new_tokens exceeds max_position_embeddings "
                         f"{tcfg.max_position_embeddings}")
    return Setup(plan, padded, lengths, max_new, max_len,
                 max_out=int(max_new.max()) + plan.max_depth + 1, max_steps=int(max_new.max()))


def _stop_tokens(stop_tokens) -> tuple[int, ...]:
    """One token id or a sequence of them -> a tuple of ints."""
    stop = np.asarray(stop_tokens)
    if stop.size == 0:
        return ()
    stop = integer_array("stop_tokens", stop)
    if stop.ndim > 1:
        raise ValueError(f"stop_tokens must be one token id or a list of them, got shape {stop.shape}")
    return tuple(int(t) for t in stop.reshape(-1))


def prefill(target, drafter, su: Setup, seed: int = 0,
            into: CompiledDecode | None = None) -> EngineState:
    """The prompts through the target (and the drafter's context); each stream's first token:
    `initial_state` on the Setup's arrays with key(seed) -> EngineState.
    into: a CompiledDecode for this setup that has run: the state is written into the buffers its
    last call returned (which are consumed), so its next call runs as recorded with no `load`."""
    dparams = drafter[1] if su.plan.dcfg is not None else None
    args = (target[1], dparams, jnp.asarray(su.prompts), jnp.asarray(su.lengths),
            jnp.asarray(su.max_new), jax.random.key(seed), su.plan, su.max_len, su.max_out,
            su.max_steps)
    buffers = into.buffers() if into is not None else None
    if buffers is None:
        return initial_state(*args)
    return _prefill_into(buffers, *args)


def generate(target, drafter, prompts: Sequence[Sequence[int]], *, method: str = "ddtree",
             budget: int = 64, max_new_tokens: int | Sequence[int] = 64, temperature: float = 0.0,
             top_k: int = 0, top_p: float = 1.0, seed: int = 0, stop_tokens: int | Sequence[int] = (),
             max_len: int | None = None, attn_impl: str = "auto", moe_impl: str = "auto",
             topk_impl: str = "auto", drafter_attn_impl: str = "auto", attn_balance: bool = True,
             stage_reps: int = 3, warmup: bool = True,
             steps_per_call: int = 1, timing_reps: int = 1,
             decode_loop: str = "auto") -> GenerateResult:
    """Speculative (or plain autoregressive) generation for S streams with their own prompts.

    target, drafter: (config, params) pairs (drafter unused for "ar"); prompts: one token list per
    stream; max_new_tokens: one int or one per stream; stop_tokens (one id or several) end a
    stream (the stop token is emitted); temperature 0 is greedy, otherwise tokens are sampled from
    the target's distribution (optionally top-k / top-p truncated). max_len: target cache slots per
    stream (default: just enough, rounded up to model.CACHE_SLOT_ALIGN). attn_impl, moe_impl: the
    target's kernel implementations ("auto": by backend); topk_impl: the tree's (the top-K, the
    search, and the accept walk with the cache compaction, "tree_accept"); drafter_attn_impl: the
    drafter's projection and attention (likewise: "pallas_triton" on a GPU); attn_balance: the
    target attention's hint for ragged stream lengths (model.forward; the same tokens either way,
    faster on Hopper when the streams' contexts differ). `stage_times` are per-step
    seconds of the separately jitted stages (0 reps: skipped).
    warmup: run the compiled step once on a copy of the state before the timed decode, so one-time
    costs of an executable's first run (such as loading its kernels) stay out of tokens/s.
    steps_per_call: engine steps per dispatch of the compiled step (see `decode`), or between the
    device loop's checks for streams with tokens left. timing_reps:
    decode this many times, each from the prefilled state loaded into the compiled call's buffers
    (`CompiledDecode.load`, before the timer starts); tokens/s uses the median time
    (every decode is the same computation and yields the same tokens: checked, a RuntimeError if
    not). decode_loop: see
    `decode_loop_for`; every loop yields the same tokens.
    """
    check_int("steps_per_call", steps_per_call, 1)
    check_int("timing_reps", timing_reps, 1)
    su = setup(target, drafter, prompts, method=method, budget=budget, max_new_tokens=max_new_tokens,
               temperature=temperature, top_k=top_k, top_p=top_p, stop_tokens=stop_tokens,
               max_len=max_len, attn_impl=attn_impl, moe_impl=moe_impl, topk_impl=topk_impl,
               drafter_attn_impl=drafter_attn_impl, attn_balance=attn_balance)
    plan, tparams = su.plan, target[1]
    loop = decode_loop_for(plan, decode_loop)
    dparams = drafter[1] if plan.dcfg is not None else None
    t0 = time.perf_counter()
    state = prefill(target, drafter, su, seed)
    state.out_len.block_until_ready()
    prefill_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    step = compile_decode(tparams, dparams, state, su, steps_per_call, loop)
    compile_s = time.perf_counter() - t0
    stage_state = copy_tree(state) if stage_reps else None
    if warmup:   # one-time costs of the executable's first run stay out of decode_s
        jax.block_until_ready(step(tparams, dparams, copy_tree(state)))
    prefilled, times, first = state, [], None
    for _ in range(timing_reps):
        state = jax.block_until_ready(step.load(prefilled))
        t0 = time.perf_counter()
        state = run_decode(step, tparams, dparams, state, su, steps_per_call, loop)
        state.out_len.block_until_ready()
        times.append(time.perf_counter() - t0)
        out_len, out_tokens = np.asarray(state.out_len), np.asarray(state.out_tokens)
        if first is None:
            first = (out_len, out_tokens)
        elif not (np.array_equal(out_len, first[0]) and np.array_equal(out_tokens, first[1])):
            raise RuntimeError("generate: the timed decodes (timing_reps) gave different tokens; "
                               "each must start from the same prefilled state")
    decode_s = float(np.median(times))

    accept = np.asarray(state.accept)
    steps = int(np.any(accept > 0, axis=0).sum())    # steps in which some stream was active
    accept = accept[:, :steps]
    tokens = [out_tokens[i, :out_len[i]].tolist() for i in range(len(prompts))]
    acc = [row[row > 0].tolist() for row in accept]
    flat = accept[accept > 0]
    generated = int(out_len.sum() - len(prompts))  # the first token comes from the prefill
    return GenerateResult(
        tokens=tokens, acceptance_lengths=acc, tau=float(flat.mean()) if flat.size else 0.0,
        tokens_per_second=generated / decode_s if decode_s > 0 else 0.0,
        stage_times=(stage_times(tparams, dparams, stage_state, plan, stage_reps, steps_per_call)
                     if stage_reps else {}),
        steps=steps, prefill_seconds=prefill_s, decode_seconds=decode_s, compile_seconds=compile_s,
        device_steps=int(state.step), decode_loop=loop)


def decode_loop_for(plan: Plan, decode_loop: str = "auto") -> str:
    """The decode loop a generate call runs: "host" (the host dispatches `steps_per_call`-step
    calls of `decode_steps`: `decode`) or "device" (one call of `_decode_on_device` runs the whole
    decode, checking every `steps_per_call` steps whether a stream has tokens left). "auto": "host" for ar
    without stop tokens, whose step count is known before it starts (the host dispatches exactly
    those calls and reads nothing), "device" otherwise. A host read of a device array can cost
    more than half a small model's ar step (docs/engine.md, "What the host costs")."""
    if decode_loop not in DECODE_LOOPS:
        raise ValueError(f"decode_loop must be one of {DECODE_LOOPS}, got {decode_loop!r}")
    if decode_loop == "auto":
        return "host" if _steps_known(plan) else "device"
    return decode_loop


def initial_left(su: Setup) -> np.ndarray:
    """[S] tokens each stream may emit after the prefill's first token, from the host's own
    inputs (no device read): max_new - 1. A stream whose first token is a stop token is done
    already, which only the device knows; this counts it as active."""
    return (su.max_new - 1).astype(np.int32)


def _steps_known(plan: Plan) -> bool:
    """Whether the steps a decode needs are known before it starts: ar without stop tokens emits
    exactly one token per step."""
    return plan.method == "ar" and not plan.stop_tokens


def exact_steps(plan: Plan, left0: np.ndarray) -> int | None:
    """The steps that finish every stream, when known before the decode starts (`_steps_known`:
    the most tokens any stream has left), else None."""
    return int(np.max(left0, initial=0)) if _steps_known(plan) else None


# XLA options the device loop's executable is compiled with: its while loop and conditionals are
# recorded into CUDA graphs as well (XLA's default records fusions, library calls and custom calls,
# and drives a while loop from the host, which reads the loop's condition every iteration), and
# graphs of any size are kept. Flags of XLA's GPU backend; other backends accept and ignore them.
# They make the device loop's decode faster and ar's host-loop step slower, so only the device
# loop is compiled with them (docs/engine.md, "DEVICE_LOOP_GRAPHS").
DEVICE_LOOP_GRAPHS = {
    "xla_gpu_enable_command_buffer": "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,DYNAMIC_SLICE_FUSION,"
                                     "WHILE,CONDITIONAL",
    "xla_gpu_graph_min_graph_size": 1,
}


def copy_tree(tree):
    """A copy of every array in `tree` (a state, a cache): new buffers, same shapes and layout."""
    return jax.tree_util.tree_map(jnp.copy, tree)


@functools.partial(jax.jit, donate_argnums=0)
def _place(buffers: EngineState, state: EngineState) -> EngineState:
    """`state` copied into `buffers` (donated): the result lives at `buffers`' addresses."""
    return jax.tree_util.tree_map(lambda b, x: b.at[...].set(x), buffers, state)


class CompiledDecode:
    """The compiled call one decode dispatches (`compile_decode`), with device buffers that stay
    the same from decode to decode.

    XLA records CUDA graphs against buffer addresses and records them again when an argument
    lives somewhere new, which costs host time at the start of a decode while the device idles
    (docs/engine.md, "CUDA graphs and stable buffers"). So the next decode's state goes into the
    buffers the last call returned: `prefill(..., into=call)` writes it there, or `load(state)`
    copies a prefilled state there (one small donated copy, `_place`; for decoding one prefilled
    state several times), and the call runs the graphs as recorded. The state a call returns
    stays valid until the next `load` or `prefill(..., into=)`, which reuse its buffers.
    """

    def __init__(self, executable):
        self.executable = executable
        self._buffers = None   # the state the last call returned

    def buffers(self, like: EngineState | None = None) -> EngineState | None:
        """The state the last call returned, if it is still alive (and laid out as `like`: under
        a mesh the step may return the drafter cache sharded otherwise than the prefill)."""
        last = self._buffers
        if last is None or any(b.is_deleted() for b in jax.tree_util.tree_leaves(last)):
            return None
        if like is not None and any(b.sharding != x.sharding for b, x in zip(
                jax.tree_util.tree_leaves(last), jax.tree_util.tree_leaves(like))):
            return None
        return last

    def load(self, state: EngineState) -> EngineState:
        """`state` (not consumed) in this call's buffers, for the next call to run on; a plain
        copy where there are none (before the first call, or laid out otherwise)."""
        last = self.buffers(like=state)
        return copy_tree(state) if last is None else _place(last, state)

    def __call__(self, tparams, dparams, state: EngineState):
        out = self.executable(tparams, dparams, state)
        self._buffers = out[0] if isinstance(out, tuple) else out
        return out


def compile_decode(tparams, dparams, state: EngineState, su: Setup, steps_per_call: int,
                   loop: str, device_graphs: bool = True) -> CompiledDecode:
    """The compiled call that one decode of `loop` dispatches: "device", state -> final state;
    "host", state -> (state, left) per `steps_per_call` steps. The device loop is compiled with
    `DEVICE_LOOP_GRAPHS` unless device_graphs=False (XLA's defaults)."""
    if loop == "device":
        lowered = _decode_all.lower(tparams, dparams, state, su.plan, steps_per_call,
                                    -(-su.max_steps // steps_per_call))
        return CompiledDecode(lowered.compile(
            compiler_options=DEVICE_LOOP_GRAPHS if device_graphs else None))
    return CompiledDecode(decode_steps.lower(tparams, dparams, state, su.plan, steps_per_call).compile())


def run_decode(call, tparams, dparams, state: EngineState, su: Setup, steps_per_call: int,
               loop: str, pace: bool | None = None) -> EngineState:
    """One decode from the prefilled `state` with `call` (compile_decode's), as `generate` runs
    it: "device", the one call; "host", `decode`, told the counts before the first step and, for
    ar without stop tokens, the exact steps, so it reads no device array at all. pace: None paces
    only with several steps per call (see `decode`)."""
    if loop == "device":
        return call(tparams, dparams, state)
    left0 = initial_left(su)
    return decode(call, tparams, dparams, state, -(-su.max_steps // steps_per_call),
                  max_lag=max(1, 3 // steps_per_call), steps_per_call=steps_per_call,
                  pace=steps_per_call > 1 if pace is None else pace, left0=left0,
                  known_steps=exact_steps(su.plan, left0))


def decode(step, tparams, dparams, state: EngineState, max_calls: int, max_lag: int = 3,
           steps_per_call: int = 1, pace: bool = True, left0: np.ndarray | None = None,
           known_steps: int | None = None) -> EngineState:
    """The host loop: call `step` (a compiled `decode_steps` of `steps_per_call` steps) until every
    stream is done or `max_calls` calls.

    Each call's `left` counts start their copy to the host when the call is dispatched; the host
    reads them once the device has produced them and blocks only while `max_lag` of them are
    outstanding, so the device never waits for the host's round trip (which can cost more than
    half a small model's step). Calls dispatched after the last useful one
    would still cost device time, so once counts have arrived the host paces itself: it
    dispatches another call only while `steps_to_finish` predicts more steps than those already
    in flight, and otherwise waits for the next counts (ar's prediction is exact; a speculative
    one that proves short costs the device one host round trip). pace=False: dispatch up to
    `max_lag` calls ahead to the end, as for an unknown finish; `generate` paces only with several
    steps per call: with one, the host's dispatch already sets the pace and the prediction's own
    host time would slow the decode (docs/engine.md, "Steps per call").
    left0 [S]: tokens each stream has left before the first step, if the caller knows them
    (otherwise three device reads). known_steps: the steps that finish
    every stream, if known before the start (ar without stop tokens): the calls that run them are
    dispatched and no counts are read.
    """
    if left0 is None:
        left0 = np.where(np.asarray(state.done), 0, np.asarray(state.max_new) - np.asarray(state.out_len))
    if not left0.any():
        return state
    if known_steps is not None:
        for _ in range(min(max_calls, -(-known_steps // steps_per_call))):
            state, _ = step(tparams, dparams, state)
        return state
    pending = collections.deque()       # `left` of dispatched calls not yet read, oldest first
    read, left = 0, left0               # calls whose counts were read; the latest counts

    def more_needed() -> bool:
        ahead = len(pending) * steps_per_call
        return not pace or read == 0 or steps_to_finish(left0, left, read * steps_per_call) > ahead

    for _ in range(max_calls):
        while pending and not more_needed():   # the calls in flight should finish: wait for them
            left, read = np.asarray(pending.popleft()), read + 1
            if not left.any():
                return state
        state, out = step(tparams, dparams, state)
        out.copy_to_host_async()
        pending.append(out)
        while pending and (len(pending) > max_lag or pending[0].is_ready()):
            left, read = np.asarray(pending.popleft()), read + 1
            if not left.any():
                return state
    return state


def steps_to_finish(left0: np.ndarray, left: np.ndarray, steps: int) -> float:
    """Predicted steps until every stream is done: each active stream's tokens left over its own
    tokens per step so far (at least 1), the largest. left0, left [S]: tokens left before the
    first step and after `steps` steps."""
    active = left > 0
    if not active.any():
        return 0.0
    rate = np.maximum((left0 - left)[active] / max(steps, 1), 1.0)
    return float(np.max(left[active] / rate))


def stage_times(tparams, dparams, state: EngineState, plan: Plan, reps: int = 3,
                steps_per_call: int = 1) -> dict:
    """Seconds per call of each stage, jitted on its own, on `state` (which is not modified);
    "step" is the engine's compiled step dispatched as `decode` does (`steps_per_call` steps per
    call), per step.

    Each stage runs `reps` times back to back after a warm-up call, as the decode loop dispatches
    steps, and the mean is reported. Verify, accept and the fused step donate the state (and the
    cache) as the engine's step does, so their cache writes are in place: each call gets its own
    copy, made before the timer starts (reps + 1 copies of the state are held at once).
    """
    def jit(fn, donate=()):
        return jax.jit(fn, static_argnames=("plan",), donate_argnames=donate)

    def timed(fn, make_args):
        calls = jax.block_until_ready([make_args() for _ in range(reps + 1)])
        with warnings.catch_warnings():   # a stage returns only part of a donated state
            warnings.filterwarnings("ignore", "Some donated buffers were not usable")
            out = jax.block_until_ready(fn(*calls[0], plan=plan))   # compile + warm up
        t0 = time.perf_counter()
        for args in calls[1:]:
            out = fn(*args, plan=plan)
        jax.block_until_ready(out)
        return (time.perf_counter() - t0) / reps, out

    times = {}
    tree = None
    if plan.method != "ar":
        times["draft"], logits = timed(jit(stage_draft), lambda: (tparams, dparams, state))
        times["tree"], tree = timed(jit(stage_tree), lambda: (logits,))
    times["verify"], (vlogits, cache, taps, tokens) = timed(
        jit(stage_verify, ("state",)), lambda: (tparams, copy_tree(state), tree))
    times["accept"], _ = timed(jit(stage_accept, ("state", "cache")), lambda: (
        dparams, copy_tree(state), tree, vlogits, copy_tree(cache), taps, tokens))
    per_call, _ = timed(functools.partial(decode_steps, steps=steps_per_call),
                        lambda: (tparams, dparams, copy_tree(state)))
    times["step"] = per_call / steps_per_call
    return times
