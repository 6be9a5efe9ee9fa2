"""Each stage of a greedy DDTree step on the GPU, checked on its own: the tree is well formed, the
verify's logits at every node are the target's for that node's path, and the committed cache
holds what a fresh forward of the committed tokens writes, except for a token whose expert choice
at an earlier layer is at a near-tie in the float32 target (`parity.routing_tie_layers`).

The shipped pair in bfloat16 with the kernels "auto" picks, held-out prompts, budgets around the
ones where greedy DDTree has left ar's tokens on an H100 (tests/framework/test_lossless_gpu.py
checks the whole decode); matmuls at JAX's default precision. A node's logits may differ from the
clean forward's in their argmax only where the float32 target is at a near-tie (`parity.tie_reason`:
of its logits, or of an expert choice on the way).
GPU only.
"""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ddtree_jax as dj
from ddtree_jax import engine
from ddtree_jax import model as tgt
from ddtree_jax.bench import parity
from ddtree_jax.training import data
from tests import ROOT

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")]

PAIR = os.path.join(ROOT, "assets", "pair")
NEW_TOKENS = 32
CACHE_TOL = 5e-2     # bf16 cache entries of one token, verify batch against a fresh forward


@functools.cache
def _pair():
    return (dj.load_target(os.path.join(PAIR, "target"), dtype=jnp.bfloat16),
            dj.load_drafter(os.path.join(PAIR, "drafter"), dtype=jnp.bfloat16))


def _tree_errors(tree, tokens) -> list[str]:
    """Node i of stream 0: parent before it, depth its parent's + 1, visibility its ancestors,
    no two children of one parent with one token."""
    par, vis = np.asarray(tree.parents[0]), np.asarray(tree.visibility[0])
    depth = np.concatenate([[0], np.asarray(tree.depths[0])])
    tok, n = np.asarray(tokens[0]), int(tree.num_nodes[0])
    errors, seen = [], set()
    for i in range(1, n + 1):
        p, anc, j = par[i], {i}, i
        if not 0 <= p < i or depth[i] != depth[p] + 1:
            errors.append(f"node {i}: parent {p}, depth {depth[i]} after {depth[p] if 0 <= p else None}")
            continue
        while j > 0:
            j = par[j]
            anc.add(j)
        if set(np.flatnonzero(vis[i]).tolist()) != anc:
            errors.append(f"node {i}: visibility is not its ancestors")
        if (p, tok[i]) in seen:
            errors.append(f"node {i}: a sibling has its token {tok[i]}")
        seen.add((p, tok[i]))
    return errors


@pytest.mark.parametrize("budget", [48, 55, 56, 64])
@pytest.mark.parametrize("prompt", [0, 1])
def test_every_stage_of_a_greedy_step_on_the_gpu(budget, prompt):
    target, drafter = _pair()
    (cfg, tparams), dparams = target, drafter[1]
    prompt_ids = data.load_prompts(os.path.join(PAIR, "heldout_prompts.json"))[prompt]
    with jax.default_matmul_precision("default"):
        su = engine.setup(target, drafter, [prompt_ids], method="ddtree", budget=budget,
                          max_new_tokens=NEW_TOKENS)
        plan = su.plan
        state = engine.prefill(target, drafter, su, 0)
        draft, build, verify, accept = (jax.jit(f, static_argnames="plan") for f in (
            engine.stage_draft, engine.stage_tree, engine.stage_verify, engine.stage_accept))
        pad = len(prompt_ids) + NEW_TOKENS + budget + 1
        clean = jax.jit(lambda p, t: tgt.target_logits(p, cfg, t, attn_impl="xla", moe_impl="xla"))
        for step in range(NEW_TOKENS):
            emitted = np.asarray(state.out_tokens[0, :int(state.out_len[0])]).tolist()
            if bool(state.done[0]):
                break
            tree = build(draft(tparams, dparams, state, plan=plan), ~state.done, plan=plan)
            logits, cache, taps, tokens = verify(tparams, state, tree, plan=plan)
            assert not _tree_errors(tree, tokens), (step, _tree_errors(tree, tokens))
            # every node's logits against a clean causal forward of its whole path
            par, tok, n = np.asarray(tree.parents[0]), np.asarray(tokens[0]), int(tree.num_nodes[0])
            rows = np.zeros((n + 1, pad), np.int32)
            ends = []
            for i in range(n + 1):
                path, j = [], i
                while j > 0:
                    path.append(int(tok[j]))
                    j = par[j]
                seq = list(prompt_ids) + emitted + path[::-1]
                rows[i, :len(seq)] = seq
                ends.append(len(seq) - 1)
            want = np.asarray(clean(tparams, rows))[np.arange(n + 1), ends]
            got = np.asarray(logits[0, :n + 1], np.float32)
            for i in range(n + 1):
                a, b = int(got[i].argmax()), int(want[i].argmax())
                if a != b:
                    assert parity.tie_reason(target, rows[i, :ends[i] + 1].tolist(), b, a), (
                        f"step {step} node {i}: verify picks {a}, the target's forward {b}, and "
                        f"the float32 target is at no near-tie there")
            state = accept(dparams, state, tree, logits, cache, taps, tokens, plan=plan)
            # the committed cache against a fresh forward of the committed tokens
            committed = list(prompt_ids) + np.asarray(
                state.out_tokens[0, :int(state.out_len[0])]).tolist()[:-1]
            length = int(state.tcache.lengths[0])
            if length != len(committed):     # the last step's emission was cut by max_new_tokens
                break
            fresh = tgt.forward(tparams, cfg, jnp.asarray([committed], jnp.int32),
                                jnp.arange(length, dtype=jnp.int32)[None],
                                tgt.init_cache(cfg, 1, tgt.aligned_slots(length), jnp.bfloat16),
                                kernels=dj.Kernels(attn="xla", moe="xla"))
            for layer, (kv, kv_fresh) in enumerate(zip(state.tcache.kv, fresh.cache.kv)):
                a = np.asarray(kv[0, :length], np.float32)
                b = np.asarray(kv_fresh[0, :length], np.float32)
                err = np.abs(a - b).max(axis=1) / max(float(np.abs(b).max()), 1e-30)
                for slot in np.flatnonzero(err > CACHE_TOL):   # a routing near-tie below the layer
                    ties = parity.routing_tie_layers(target, committed[:slot + 1])
                    assert any(t < layer for t in ties), (
                        f"step {step} layer {layer}: cache slot {slot} off by {err[slot]:.3g}, and "
                        f"its token is at no routing near-tie in an earlier layer (ties at {ties})")
