"""`generate`: one static batch of streams, prefilled and decoded to the end, with its metrics."""

from __future__ import annotations

import time
from typing import Sequence

import jax
import numpy as np

from ddtree_jax.budget import StepTimeCurve
from ddtree_jax.engine.loops import compile_decode, decode_loop_for, run_decode
from ddtree_jax.engine.memory import check_memory
from ddtree_jax.engine.prefilling import prefill
from ddtree_jax.config import Kernels
from ddtree_jax.engine.state import Decoding, GenerateResult, copy_tree, resolve_options, setup
from ddtree_jax.sampling import Sampling
from ddtree_jax.engine.step import stage_times
from ddtree_jax.tokenizer import Tokenizer


def generate(target, drafter, prompts: Sequence[str | Sequence[int]], *, method: str = "ddtree",
             budget: int = 64, shared_budget: int | StepTimeCurve | None = None,
             max_new_tokens: int | Sequence[int] = 64,
             sampling: Sampling | None = None, seed: int = 0, stop_tokens: int | Sequence[int] = (),
             max_len: int | None = None, kernels: Kernels | None = None,
             decoding: Decoding | None = None, tokenizer: Tokenizer | None = None,
             **options) -> GenerateResult:
    """Speculative (or plain autoregressive) generation for S streams with their own prompts.

    target, drafter: (config, params) pairs (drafter unused for "ar"); prompts: one prompt per
    stream, a token list or (with `tokenizer`) a str; tokenizer (ddtree_jax.Tokenizer): encodes
    text prompts (no special tokens added) and decodes each stream's tokens into `texts`;
    method: "ar", "dflash" (the drafter's greedy chain) or "ddtree" (a tree of `budget`
    nodes); shared_budget ("ddtree" only): None, every stream verifies its own tree of `budget`
    nodes; an int N, each step verifies the N best nodes over all unfinished streams' trees, at
    most `budget` per stream (tree.share_budget: a sure stream gets a deep tree, an unsure one a
    small one, a finished one none); a budget.StepTimeCurve of step seconds over such totals, N
    chosen per step by the expected rate (budget.shared_total). max_new_tokens: one int or one per
    stream; stop_tokens (one id or several) end a stream (the stop token is emitted); max_len:
    target cache slots per stream (default: just enough, rounded up to model.CACHE_SLOT_ALIGN).
    sampling (sampling.Sampling): greedy by default; otherwise tokens are drawn from the target's
    distribution (optionally top-k / top-p truncated) with key(seed).
    kernels (config.Kernels): the kernel implementations, "auto" by default.
    decoding (Decoding): the decode loop, steps per call and timing repetitions; every choice
    yields the same tokens (checked across timing_reps decodes: RuntimeError if not).
    options: keyword aliases of single fields of the three (temperature=0.5, attn_impl="xla",
    steps_per_call=4, ...; `resolve_options`).
    `stage_times` are per-step seconds of the separately jitted stages (stage_reps 0: none);
    tokens/s counts generated tokens over the median decode time, compile and warm-up excluded.
    Every stream's first token comes at the end of the prefill (`first_token_seconds`, timed after
    a warm-up prefill with decoding.warmup) and its last after its own steps at the decode's mean
    step time (`last_token_seconds`).
    """
    sampling, kernels, decoding = resolve_options(sampling, kernels, decoding, **options)
    su = setup(target, drafter, prompts, method=method, budget=budget, shared_budget=shared_budget,
               max_new_tokens=max_new_tokens, sampling=sampling, stop_tokens=stop_tokens,
               max_len=max_len, kernels=kernels, tokenizer=tokenizer)
    plan, tparams, streams = su.plan, target[1], len(su.lengths)
    check_memory(plan, streams, su.max_len, tparams)
    loop = decode_loop_for(plan, decoding.decode_loop)
    dparams = drafter[1] if plan.dcfg is not None else None
    t0 = time.perf_counter()
    if decoding.warmup:   # the prefill's compile and first run stay out of prefill_seconds
        jax.block_until_ready(prefill(target, drafter, su, seed))
    warm_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    state = prefill(target, drafter, su, seed)
    state.out_len.block_until_ready()
    prefill_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    step = compile_decode(tparams, dparams, state, su, decoding.steps_per_call, loop)
    compile_s = time.perf_counter() - t0 + warm_s
    stage_state = copy_tree(state) if decoding.stage_reps else None
    if decoding.warmup:   # one-time costs of the executable's first run stay out of decode_s
        jax.block_until_ready(step(tparams, dparams, copy_tree(state)))
    prefilled, times, first = state, [], None
    for _ in range(decoding.timing_reps):
        state = jax.block_until_ready(step.load(prefilled))
        t0 = time.perf_counter()
        state = run_decode(step, tparams, dparams, state, su, decoding.steps_per_call, loop,
                           max_lag=decoding.max_lag)
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
    accept, nodes = accept[:, :steps], np.asarray(state.nodes)[:, :steps]
    tokens = [out_tokens[i, :out_len[i]].tolist() for i in range(streams)]
    acc = [row[row > 0].tolist() for row in accept]
    flat = accept[accept > 0]
    generated = int(out_len.sum() - streams)  # the first token comes from the prefill
    step_s = decode_s / int(state.step) if int(state.step) else 0.0
    return GenerateResult(
        tokens=tokens, acceptance_lengths=acc, tau=float(flat.mean()) if flat.size else 0.0,
        tokens_per_second=generated / decode_s if decode_s > 0 else 0.0,
        stage_times=(stage_times(tparams, dparams, stage_state, plan, decoding.stage_reps,
                                 decoding.steps_per_call) if decoding.stage_reps else {}),
        steps=steps, prefill_seconds=prefill_s, decode_seconds=decode_s, compile_seconds=compile_s,
        device_steps=int(state.step), decode_loop=loop,
        texts=[tokenizer.decode(t) for t in tokens] if tokenizer is not None else None,
        first_token_seconds=[prefill_s] * streams,
        last_token_seconds=[prefill_s + len(a) * step_s for a in acc],
        nodes_per_step=plan.nodes, max_accept_length=plan.max_depth + 1,
        tree_nodes=[n[a > 0].tolist() for n, a in zip(nodes, accept)], decode_times=times)
