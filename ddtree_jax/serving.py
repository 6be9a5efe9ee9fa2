"""Continuous batching: N requests served by S stream slots, a finished slot refilled at once.

`generate` runs a static batch: every stream starts together and the batch steps until its slowest
stream is done, so streams that finish early idle (a batch runs far more steps than its mean
stream needs: docs/engine.md, "More streams"). `serve` keeps S slots busy instead: the engine's own
step (the same compiled function, per-stream done flags) runs on the slots; when the host sees a
slot done (at most `max_lag` calls late, without making the device wait), it copies that slot's
row out and admits the next request into the slot with a prefill (`_admit`: the prompt through
the target and the drafter's context, written into the slot's rows of every cache; the other slots
are untouched). Slots seen done in the same poll are copied out and refilled together, one call
each padded to a compiled size (`batch_sizes`), since one admission costs host and device time
worth several ar steps (docs/engine.md, "Continuous batching"). Per request the output equals
`generate`'s for the same prompt (greedy: token for token); sampled draws come from the admission
call's key.

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
from ddtree_jax.checks import check_int
from ddtree_jax.config import Kernels
from ddtree_jax.engine import EngineState, GenerateResult, Plan
from ddtree_jax.sampling import Sampling
from ddtree_jax.tokenizer import Tokenizer


def _put(big, small, slots, axis: int):
    """big with small's rows written at indices `slots` [A] of `axis` (an index >= the axis' size,
    a padding entry, writes nothing)."""
    where = (slice(None),) * axis + (slots,)
    return big.at[where].set(small.astype(big.dtype), mode="drop")


@functools.partial(jax.jit, static_argnames=("plan", "max_len", "max_out", "max_steps"),
                   donate_argnames=("state",))
def _admit(tparams, dparams, state: EngineState, slots, reqs, prompts, lengths, max_new,
           plan: Plan, max_len: int, max_out: int, max_steps: int) -> tuple[EngineState, jnp.ndarray]:
    """Prefill requests `reqs` [A] (rows of prompts [N, P], lengths [N], max_new [N]) together,
    into stream slots `slots` [A] of `state`; a slot >= S (padding to a compiled size) is dropped.
    -> (state, the requests' first tokens [A]: ready once they are chosen)."""
    key, sub = jax.random.split(state.key)
    new = engine.initial_state(tparams, dparams, prompts[reqs], lengths[reqs], max_new[reqs], sub,
                               plan, max_len, max_out, max_steps)
    kv = tuple(_put(b, n, slots, 0) for b, n in zip(state.tcache.kv, new.tcache.kv))
    tcache = state.tcache.replace(kv=kv, lengths=_put(state.tcache.lengths, new.tcache.lengths, slots, 0))
    dcache = state.dcache
    if dcache is not None:      # k, v: [L, S, ...]
        dcache = type(dcache)(_put(dcache.k, new.dcache.k, slots, 1),
                              _put(dcache.v, new.dcache.v, slots, 1),
                              _put(dcache.lengths, new.dcache.lengths, slots, 0))
    rows = {f: _put(getattr(state, f), getattr(new, f), slots, 0)
            for f in ("pending", "out_tokens", "out_len", "accept", "nodes", "done", "max_new")}
    return engine.shard_state(state.replace(tcache=tcache, dcache=dcache, key=key, **rows)), new.pending


@jax.jit
def _rows(state: EngineState, slots):
    """Slots [A]' (out_tokens [A, max_out], out_len [A], accept [A, max_steps], nodes
    [A, max_steps]), copied out."""
    return state.out_tokens[slots], state.out_len[slots], state.accept[slots], state.nodes[slots]


def batch_sizes(streams: int) -> tuple[int, ...]:
    """The compiled admission sizes for `streams` slots: powers of 4 below it, and itself."""
    sizes, a = [], 1
    while a < streams:
        sizes.append(a)
        a *= 4
    return tuple(sizes) + (streams,)


def serve(target, drafter, prompts: Sequence[str | Sequence[int]], *, streams: int,
          method: str = "ddtree", budget: int = 64, shared_budget=None,
          max_new_tokens: int | Sequence[int] = 64,
          sampling: Sampling | None = None, seed: int = 0, stop_tokens: int | Sequence[int] = (),
          max_len: int | None = None, kernels: Kernels | None = None,
          decoding: engine.Decoding | None = None, tokenizer: Tokenizer | None = None,
          **options) -> GenerateResult:
    """Serve every prompt (one request each, in order) with `streams` slots decoding at once.

    Arguments as `engine.generate` (max_new_tokens: one int or one per request; kernels'
    attn_balance is meant for this ragged case: the slots' contexts differ; shared_budget: the
    slots share it, and a finished or idle slot, done until its next admission, takes none of it;
    prompts: token lists or, with `tokenizer`, strings); of `decoding`, serve uses steps_per_call,
    max_lag and warmup. Returns a GenerateResult with one entry per request in `tokens`, `texts`
    (with a tokenizer), `acceptance_lengths`, `tree_nodes` and `request_seconds` (host clock from
    the request's admission, or the start for the first `streams`, to the host seeing it done: up
    to max_lag calls late); `steps` counts the steps in which some slot was active,
    `decode_seconds` the serving wall time, `prefill_seconds` the first `streams` prompts' prefill
    (timed after a warm-up one with warmup); no stage times. Every request arrives at the start:
    `first_token_seconds` and `last_token_seconds` run from the first prefill's start, compile and
    warm-up left out, to the host seeing the request's first token chosen (its admission's prefill
    done) and the request done.
    """
    check_int("streams", streams, 1)
    sampling, kernels, decoding = engine.resolve_options(sampling, kernels, decoding, **options)
    steps_per_call, lag, warmup = decoding.steps_per_call, decoding.lag, decoding.warmup
    su = engine.setup(target, drafter, prompts, method=method, budget=budget,
                      shared_budget=shared_budget, max_new_tokens=max_new_tokens, sampling=sampling,
                      stop_tokens=stop_tokens, max_len=max_len, kernels=kernels, tokenizer=tokenizer)
    plan, tparams = su.plan, target[1]
    dparams = drafter[1] if plan.dcfg is not None else None
    n = len(su.lengths)
    s = min(int(streams), n)
    engine.check_memory(plan, s, su.max_len, tparams)
    # Global step columns of `accept`: a request is active <= max_new steps, a slot idles <= lag + 1
    # calls between two requests, and the loop ends <= lag calls after the last one is done.
    max_steps = int(su.max_new.sum()) + (n + 1) * (lag + 1) * steps_per_call
    static = dict(plan=plan, max_len=su.max_len, max_out=su.max_out, max_steps=max_steps)
    prompts_dev = jnp.asarray(su.prompts)
    lengths_dev, max_new_dev = jnp.asarray(su.lengths), jnp.asarray(su.max_new)

    def prefill():                 # the first `s` requests into the slots
        return engine.initial_state(tparams, dparams, prompts_dev[:s], lengths_dev[:s],
                                    max_new_dev[:s], jax.random.key(seed), **static)

    t0 = time.perf_counter()
    if warmup:   # the prefill's compile and first run stay out of prefill_seconds
        jax.block_until_ready(prefill())
    warm_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    state = jax.block_until_ready(prefill())
    prefill_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    step = engine.decode_steps.lower(tparams, dparams, state, plan, steps_per_call).compile()
    admit, pad = {}, np.int32(s)       # one executable per admission size; pad: a dropped slot
    for a in batch_sizes(s):
        idx = np.zeros(a, np.int32)
        admit[a] = _admit.lower(tparams, dparams, state, idx, idx, prompts_dev, lengths_dev,
                                max_new_dev, **static).compile()
    compile_s = time.perf_counter() - t0 + warm_s
    if warmup:   # first-run costs of the executables stay out of the timed loop
        jax.block_until_ready(step(tparams, dparams, engine.copy_tree(state)))
        for a, fn in admit.items():
            idx = np.full(a, pad, np.int32)
            jax.block_until_ready(fn(tparams, dparams, engine.copy_tree(state), idx, idx * 0,
                                     prompts_dev, lengths_dev, max_new_dev))
            jax.block_until_ready(_rows(state, idx * 0))

    seen, started = [0.0] * n, [0.0] * n   # host clock: result seen, request admitted
    first = [None] * n              # host clock: the request's first token seen chosen
    firsts = collections.deque()    # (first tokens of an admission, its requests), oldest first
    slot_req = list(range(s))       # request in each slot (None: idle)
    admitted_at = [0] * s           # calls dispatched before the slot's request was admitted
    copied, next_req, calls = [], s, 0   # copied: (rows on their way to the host, their requests)
    flags = collections.deque()     # (call number, tokens left per slot on their way to the host)
    t0 = time.perf_counter()
    started[:s] = first[:s] = [t0] * s

    def poll_firsts():             # admissions run in order: the oldest is ready first
        while firsts and firsts[0][0].is_ready():
            now = time.perf_counter()
            for r in firsts.popleft()[1]:
                first[r] = now

    while any(r is not None for r in slot_req):
        if calls * steps_per_call >= max_steps:
            raise RuntimeError(f"serve: {calls} calls without finishing (bound {max_steps} steps)")
        state, left = step(tparams, dparams, state)
        calls += 1
        left.copy_to_host_async()
        flags.append((calls, left))
        poll_firsts()
        finished = []                # (slot, request) seen done in this poll
        while flags and (len(flags) > lag or flags[0][1].is_ready()):
            call, left = flags.popleft()
            for slot in np.flatnonzero(np.asarray(left) == 0):
                r = slot_req[slot]
                if r is None or call <= admitted_at[slot]:   # idle, or flags from before admission
                    continue
                finished.append((int(slot), r))
                slot_req[slot] = None
        if not finished:
            continue
        # Copy the finished rows out, then refill those slots: one call each, padded to a size.
        now = time.perf_counter()
        a = min(x for x in admit if x >= len(finished))
        slots = np.full(a, pad, np.int32)
        slots[:len(finished)] = [slot for slot, _ in finished]
        out = _rows(state, np.minimum(slots, s - 1))
        for x in out:
            x.copy_to_host_async()
        copied.append((out, [r for _, r in finished]))
        poll_firsts()
        for _, r in finished:      # (a device runs its calls in order: its first token is ready)
            seen[r] = now
            first[r] = now if first[r] is None else first[r]
        take = min(len(finished), n - next_req)
        if take:
            slots[take:] = pad
            reqs = np.zeros(a, np.int32)
            reqs[:take] = np.arange(next_req, next_req + take)
            state, firsts_out = admit[a](tparams, dparams, state, slots, reqs, prompts_dev,
                                         lengths_dev, max_new_dev)
            firsts.append((firsts_out, range(next_req, next_req + take)))
            started[next_req:next_req + take] = [time.perf_counter()] * take
            for slot, r in zip(slots[:take], reqs[:take]):
                slot_req[slot], admitted_at[slot] = int(r), calls
            next_req += take
    rows = {}
    for out, reqs in copied:
        out = [np.asarray(x) for x in out]
        rows.update({r: tuple(x[i] for x in out) for i, r in enumerate(reqs)})
    decode_s = time.perf_counter() - t0

    tokens = [rows[r][0][:int(rows[r][1])].tolist() for r in range(n)]
    clock = lambda t: prefill_s + t - t0    # noqa: E731  (from the first prefill's start)
    acc = [rows[r][2][rows[r][2] > 0].tolist() for r in range(n)]
    tree_nodes = [rows[r][3][rows[r][2] > 0].tolist() for r in range(n)]
    flat = np.concatenate([np.asarray(a, np.int64) for a in acc])
    active = np.zeros(max_steps, bool)
    for r in range(n):
        active |= rows[r][2] > 0
    generated = sum(len(t) - 1 for t in tokens)   # each request's first token comes from its prefill
    return GenerateResult(
        tokens=tokens, acceptance_lengths=acc, tau=float(flat.mean()) if flat.size else 0.0,
        tokens_per_second=generated / decode_s if decode_s > 0 else 0.0, stage_times={},
        steps=int(active.sum()), prefill_seconds=prefill_s, decode_seconds=decode_s,
        compile_seconds=compile_s, request_seconds=[seen[r] - started[r] for r in range(n)],
        device_steps=calls * steps_per_call, tree_nodes=tree_nodes,
        texts=[tokenizer.decode(t) for t in tokens] if tokenizer is not None else None,
        first_token_seconds=[clock(first[r]) for r in range(n)],
        last_token_seconds=[clock(seen[r]) for r in range(n)],
        nodes_per_step=plan.nodes, max_accept_length=plan.max_depth + 1, decode_times=[decode_s])
