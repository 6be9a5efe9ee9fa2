"""Continuous batching: N requests served by S stream slots, a finished slot refilled at once.

`generate` runs a static batch: every stream starts together and the batch steps until its slowest
stream is done, so streams that finish early idle (on the H200 at 16 streams, ddtree batches ran
46-53 steps against a mean of 28 per stream). `serve` keeps S slots busy instead: the engine's own
step (the same compiled function, per-stream done flags) runs on the slots; when the host sees a
slot done (at most `max_lag` calls late, without making the device wait), it copies that slot's
row out and admits the next request into the slot with its own prefill (`_admit`: the prompt
through the target and the drafter's context, written into the slot's rows of every cache; the
other slots are untouched). Per request the output equals `generate`'s for the same prompt (greedy:
token for token); sampled draws come from the slot's position in the shared key stream.

tokens/s here = generated tokens / wall time from the first step to the last request's result,
with every admission's prefill inside it (the first S prompts' prefill is reported apart).
"""

from __future__ import annotations

import collections
import functools
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ddtree_jax import engine
from ddtree_jax.engine import EngineState, GenerateResult, Plan


def _put(big, small, slot, axis: int):
    """big with small (size 1 along `axis`) written at index `slot` of that axis."""
    return jax.lax.dynamic_update_slice_in_dim(big, small.astype(big.dtype), slot, axis)


@functools.partial(jax.jit, static_argnames=("plan", "max_len", "max_out", "max_steps"),
                   donate_argnames=("state",))
def _admit(tparams, dparams, state: EngineState, slot, tokens, length, max_new, plan: Plan,
           max_len: int, max_out: int, max_steps: int) -> EngineState:
    """Prefill one request (tokens [P] padded, length, max_new) into stream `slot` of `state`."""
    key, sub = jax.random.split(state.key)
    one = engine._prefill(tparams, dparams, tokens[None], length[None], max_new[None], sub, plan,
                          max_len, max_out, max_steps)
    kv = tuple(_put(b, s, slot, 0) for b, s in zip(state.tcache.kv, one.tcache.kv))
    tcache = state.tcache.replace(kv=kv, lengths=_put(state.tcache.lengths, one.tcache.lengths, slot, 0))
    dcache = state.dcache
    if dcache is not None:      # k, v: [L, S, ...]
        dcache = type(dcache)(_put(dcache.k, one.dcache.k, slot, 1),
                              _put(dcache.v, one.dcache.v, slot, 1),
                              _put(dcache.lengths, one.dcache.lengths, slot, 0))
    rows = {f: _put(getattr(state, f), getattr(one, f), slot, 0)
            for f in ("pending", "out_tokens", "out_len", "accept", "done", "max_new")}
    return engine.shard_state(state.replace(tcache=tcache, dcache=dcache, key=key, **rows))


@jax.jit
def _row(state: EngineState, slot):
    """One slot's (out_tokens [max_out], out_len [], accept [max_steps]), copied out of the state."""
    return state.out_tokens[slot], state.out_len[slot], state.accept[slot]


def serve(target, drafter, prompts: Sequence[Sequence[int]], *, streams: int, method: str = "ddtree",
          budget: int = 64, max_new_tokens: int | Sequence[int] = 64, temperature: float = 0.0,
          top_k: int = 0, top_p: float = 1.0, seed: int = 0, stop_tokens: Sequence[int] = (),
          max_len: int | None = None, attn_impl: str = "auto", moe_impl: str = "auto",
          topk_impl: str = "auto", steps_per_call: int = 1, max_lag: int | None = None,
          warmup: bool = True) -> GenerateResult:
    """Serve every prompt (one request each, in order) with `streams` slots decoding at once.

    Arguments as `engine.generate` (max_new_tokens: one int or one per request). Returns a
    GenerateResult with one entry per request in `tokens`, `acceptance_lengths` and
    `request_seconds` (host clock from the request's admission, or the start for the first
    `streams`, to the host seeing it done: up to `max_lag` calls late); `steps` counts the steps in
    which some slot was active, `decode_seconds` the serving wall time, `prefill_seconds` the first
    `streams` prompts' prefill; no stage times.
    """
    if not isinstance(streams, (int, np.integer)) or streams < 1:
        raise ValueError(f"streams must be an int >= 1, got {streams!r}")
    if not isinstance(steps_per_call, (int, np.integer)) or steps_per_call < 1:
        raise ValueError(f"steps_per_call must be an int >= 1, got {steps_per_call!r}")
    lag = max(1, 3 // steps_per_call) if max_lag is None else max_lag
    if lag < 1:
        raise ValueError(f"max_lag must be >= 1, got {max_lag!r}")
    su = engine.setup(target, drafter, prompts, method=method, budget=budget,
                      max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                      top_p=top_p, stop_tokens=stop_tokens, max_len=max_len, attn_impl=attn_impl,
                      moe_impl=moe_impl, topk_impl=topk_impl)
    plan, tparams = su.plan, target[1]
    dparams = drafter[1] if plan.dcfg is not None else None
    n, s = len(prompts), min(int(streams), len(prompts))
    # Global step columns of `accept`: a request is active <= max_new steps, a slot idles <= lag + 1
    # calls between two requests, and the loop ends <= lag calls after the last one is done.
    max_steps = int(su.max_new.sum()) + (n + 1) * (lag + 1) * steps_per_call
    static = dict(plan=plan, max_len=su.max_len, max_out=su.max_out, max_steps=max_steps)
    prompts_dev = jnp.asarray(su.prompts)
    lengths_dev, max_new_dev = jnp.asarray(su.lengths), jnp.asarray(su.max_new)

    t0 = time.perf_counter()
    state = engine._prefill(tparams, dparams, prompts_dev[:s], lengths_dev[:s], max_new_dev[:s],
                            jax.random.key(seed), **static)
    jax.block_until_ready(state)
    prefill_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    step = engine._step.lower(tparams, dparams, state, plan, steps_per_call).compile()
    slot0 = np.int32(0)       # slots are passed as int32 scalars, as compiled
    admit = _admit.lower(tparams, dparams, state, slot0, prompts_dev[0], lengths_dev[0],
                         max_new_dev[0], **static).compile()
    compile_s = time.perf_counter() - t0
    copy = functools.partial(jax.tree_util.tree_map, jnp.copy)
    if warmup:   # first-run costs of the three executables stay out of the timed loop
        jax.block_until_ready(step(tparams, dparams, copy(state)))
        jax.block_until_ready(admit(tparams, dparams, copy(state), slot0, prompts_dev[0],
                                    lengths_dev[0], max_new_dev[0]))
        jax.block_until_ready(_row(state, slot0))

    seen, started = [0.0] * n, [0.0] * n   # host clock: result seen, request admitted
    slot_req = list(range(s))       # request in each slot (None: idle)
    admitted_at = [0] * s           # calls dispatched before the slot's request was admitted
    rows, next_req, calls = {}, s, 0
    flags = collections.deque()     # (call number, done flags on their way to the host)
    t0 = time.perf_counter()
    started[:s] = [t0] * s
    while any(r is not None for r in slot_req):
        if calls * steps_per_call >= max_steps:
            raise RuntimeError(f"serve: {calls} calls without finishing (bound {max_steps} steps)")
        state, done = step(tparams, dparams, state)
        calls += 1
        done.copy_to_host_async()
        flags.append((calls, done))
        while flags and (len(flags) > lag or flags[0][1].is_ready()):
            call, done = flags.popleft()
            for slot in np.flatnonzero(np.asarray(done)).astype(np.int32):
                r = slot_req[slot]
                if r is None or call <= admitted_at[slot]:   # idle, or flags from before admission
                    continue
                rows[r] = _row(state, slot)
                seen[r] = time.perf_counter()
                for x in rows[r]:
                    x.copy_to_host_async()
                slot_req[slot] = None
                if next_req < n:
                    state = admit(tparams, dparams, state, slot, prompts_dev[next_req],
                                  lengths_dev[next_req], max_new_dev[next_req])
                    started[next_req] = time.perf_counter()
                    slot_req[slot], admitted_at[slot], next_req = next_req, calls, next_req + 1
    rows = {r: tuple(np.asarray(x) for x in row) for r, row in rows.items()}
    decode_s = time.perf_counter() - t0

    tokens = [rows[r][0][:int(rows[r][1])].tolist() for r in range(n)]
    acc = [rows[r][2][rows[r][2] > 0].tolist() for r in range(n)]
    flat = np.concatenate([np.asarray(a, np.int64) for a in acc])
    active = np.zeros(max_steps, bool)
    for r in range(n):
        active |= rows[r][2] > 0
    generated = sum(len(t) - 1 for t in tokens)   # each request's first token comes from its prefill
    return GenerateResult(
        tokens=tokens, acceptance_lengths=acc, tau=float(flat.mean()) if flat.size else 0.0,
        tokens_per_second=generated / decode_s if decode_s > 0 else 0.0, stage_times={},
        steps=int(active.sum()), prefill_seconds=prefill_s, decode_seconds=decode_s,
        compile_seconds=compile_s, request_seconds=[seen[r] - started[r] for r in range(n)])
