"""The prompts through the target and the drafter's context: a decode's starting state."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ddtree_jax import drafter as dft
from ddtree_jax import model as tgt
from ddtree_jax.engine.loops import CompiledDecode
from ddtree_jax.engine.state import EngineState, Plan, Setup, shard_state
from ddtree_jax.sampling import choose


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
                      kernels=plan.kernels)
    key, sub = jax.random.split(key)
    last = jnp.take_along_axis(out.logits, (lengths - 1)[:, None, None], axis=1)[:, 0]
    first = choose(last, sub, plan.sampling)
    dcache = None
    if use_drafter:
        dcache = dft.init_drafter_cache(plan.dcfg, s, max_len, dtype)
        dcache = dft.append_context(dparams, plan.dcfg, dcache, out.taps, positions, lengths,
                                    attn_impl=plan.kernels.drafter_attn)
    out_tokens = jnp.zeros((s, max_out), jnp.int32).at[:, 0].set(first)
    done = (max_new <= 1)
    if plan.stop_tokens:
        done = done | jnp.isin(first, jnp.asarray(plan.stop_tokens, jnp.int32))
    return shard_state(EngineState(
        tcache=out.cache, dcache=dcache, pending=first, out_tokens=out_tokens,
        out_len=jnp.ones((s,), jnp.int32), accept=jnp.zeros((s, max_steps), jnp.int32),
        nodes=jnp.zeros((s, max_steps), jnp.int32), done=done,
        max_new=max_new, step=jnp.zeros((), jnp.int32), key=key))


_PREFILL_STATIC = ("plan", "max_len", "max_out", "max_steps")
initial_state = jax.jit(_prefill_state, static_argnames=_PREFILL_STATIC)
initial_state.__doc__ = """initial_state(tparams, dparams, tokens [S, P] int32, lengths [S] int32,
    max_new [S] int32, key, plan, max_len, max_out, max_steps) -> EngineState: the decode's starting
state, jitted (plan and the sizes static): the zero-padded prompts `tokens` (true lengths `lengths`)
through the target, the drafter's context appended (not for ar), each stream's first token chosen
with `key`; the target cache has `max_len` slots per stream, out_tokens [S, max_out], accept
and nodes [S, max_steps]. `prefill` calls it with a Setup's arrays and key(seed); call it directly
for other arrays, sizes or keys, or inside another jitted function (serving's admission)."""


@functools.partial(jax.jit, static_argnames=_PREFILL_STATIC, donate_argnames=("buffers",),
                   keep_unused=True)
def _prefill_into(buffers: EngineState, tparams, dparams, tokens, lengths, max_new, key, plan: Plan,
                  max_len: int, max_out: int, max_steps: int) -> EngineState:
    """`initial_state` with its state written into `buffers` (donated, same shapes and layout)."""
    del buffers   # only donated: XLA writes the outputs into them
    return _prefill_state(tparams, dparams, tokens, lengths, max_new, key, plan, max_len, max_out,
                          max_steps)


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
