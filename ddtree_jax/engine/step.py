"""One engine step (draft -> tree -> verify -> accept -> compact) and its stages; stage timing."""

from __future__ import annotations

import functools
import time
import warnings

import jax
import jax.numpy as jnp

from ddtree_jax import drafter as dft
from ddtree_jax import model as tgt
from ddtree_jax import sharding
from ddtree_jax import tree as trees
from ddtree_jax.budget import StepTimeCurve, shared_total
from ddtree_jax.engine.state import EngineState, Plan, copy_tree, shard_state
from ddtree_jax.sampling import choose
from pallas_kernels.tree_accept import tree_accept


def stage_draft(tparams, dparams, state: EngineState, plan: Plan):
    """-> draft logits [S, B-1, V] float32 for depths 1..B-1."""
    emb = dft.block_embedding(tparams, plan.dcfg, state.pending)
    pos = state.tcache.lengths[:, None] + jnp.arange(plan.dcfg.block_size, dtype=jnp.int32)
    hidden = dft.draft_block(dparams, plan.dcfg, state.dcache, emb, pos,
                             attn_impl=plan.kernels.drafter_attn)
    return dft.draft_logits(tparams, hidden[:, 1:])


def stage_tree(draft_logits, active, plan: Plan) -> trees.Tree:
    """draft logits [S, L, V], active [S] bool -> the step's Tree. "ddtree": `plan.budget` nodes
    per stream, or with `plan.shared_budget` the best N nodes over the active streams, at most
    `plan.budget` each (N fixed, or chosen per step from the step-time curve: budget.shared_total);
    "dflash": the greedy chain."""
    if plan.method != "ddtree":
        return chain_tree(draft_logits)
    tree = trees.build_tree(draft_logits, plan.budget, topk_impl=plan.kernels.topk)
    if plan.shared_budget is None:
        return tree
    total = plan.shared_budget
    if isinstance(total, StepTimeCurve):
        total = shared_total(tree.scores, tree.num_nodes, active, total)
    return trees.share_budget(tree, total, active=active)


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
    tokens [S, N] int32: the verified tokens, root first). The routed experts compute an active
    stream's root and real nodes only (num_new: a tree's padding nodes follow its real ones), and
    nothing of a finished stream."""
    root = state.pending[:, None]
    active = ~state.done
    if tree is None:
        tokens, depth, vis = root, jnp.zeros_like(root), None
        num_new = active.astype(jnp.int32)
    else:
        tokens = jnp.concatenate([root, tree.tokens], axis=1)
        depth = jnp.concatenate([jnp.zeros_like(root), tree.depths], axis=1)
        vis = tree.visibility
        num_new = jnp.where(active, tree.num_nodes + 1, 0)
    taps = plan.dcfg.target_layer_ids if plan.dcfg is not None and plan.method != "ar" else ()
    out = tgt.forward(tparams, plan.tcfg, tokens, state.tcache.lengths[:, None] + depth, state.tcache,
                      visibility=vis, num_new=num_new, taps=taps, kernels=plan.kernels)
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
            functools.partial(tree_accept, impl=plan.kernels.topk), tree, tokens, posterior, start,
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
                                    attn_impl=plan.kernels.drafter_attn)
    tcache = tgt.LatentCache(kv=kv, lengths=start + keep)
    accept = state.accept.at[:, state.step].set(jnp.where(active, acc_len, 0), mode="drop")
    verified = jnp.zeros_like(acc_len) if tree is None else jnp.where(active, tree.num_nodes, 0)
    nodes = state.nodes.at[:, state.step].set(verified, mode="drop")
    return shard_state(EngineState(
        tcache=tcache, dcache=dcache, pending=jnp.where(active, bonus, state.pending),
        out_tokens=out_tokens, out_len=out_len, accept=accept, nodes=nodes, done=done,
        max_new=state.max_new, step=state.step + 1, key=key))


def speculative_step(tparams, dparams, state: EngineState, plan: Plan) -> EngineState:
    """draft -> tree -> verify -> accept -> compact, for every stream at once. Each stage runs in
    a named scope of its own ("draft", "tree", "verify", "accept"), which the compiled HLO keeps in
    its ops' metadata: experiments/step_profile.py splits a traced step's kernels by it."""
    tree = None
    if plan.method != "ar":
        with jax.named_scope("draft"):
            draft_logits = stage_draft(tparams, dparams, state, plan)
        with jax.named_scope("tree"):
            tree = stage_tree(draft_logits, ~state.done, plan)
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
        times["tree"], tree = timed(jit(stage_tree), lambda: (logits, ~state.done))
    times["verify"], (vlogits, cache, taps, tokens) = timed(
        jit(stage_verify, ("state",)), lambda: (tparams, copy_tree(state), tree))
    times["accept"], _ = timed(jit(stage_accept, ("state", "cache")), lambda: (
        dparams, copy_tree(state), tree, vlogits, copy_tree(cache), taps, tokens))
    per_call, _ = timed(functools.partial(decode_steps, steps=steps_per_call),
                        lambda: (tparams, dparams, copy_tree(state)))
    times["step"] = per_call / steps_per_call
    return times
