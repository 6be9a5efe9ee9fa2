"""Accepting a verified tree ("tree_accept"): every implementation against the numpy golden (a
sequential walk), exactly, on real DDTree trees; outputs poisoned; bad arguments named."""

import jax.numpy as jnp
import numpy as np
import pytest

from ddtree_jax import tree as trees
from pallas_kernels.tree_accept import tree_accept
from pallas_kernels.tree_accept.pallas_triton import tree_accept_pallas
from pallas_kernels.tree_accept.reference import tree_accept_reference
from tests.kernel_testing import fresh_rng, runnable_impls


def _case(S, L, V, B, follow=0.8, Dk=20, W=24, layers=2, total=None):
    """A DDTree tree of random draft logits (total: of a shared budget of `total` nodes over the
    streams, at most B each); a posterior that picks one of each node's children's tokens with
    probability `follow` (else a random token, or with `total` token 0, the padding nodes' token;
    stream 0's root always follows), so walks of many lengths occur. The caches hold the N
    verified nodes at slots start.. start + N - 1, as the verify step leaves them."""
    rng = fresh_rng()
    logits = jnp.asarray(rng.standard_normal((S, L, V)) * 2, jnp.float32)
    t = (trees.build_tree(logits, B, topk_impl="xla") if total is None
         else trees.build_shared_tree(logits, total, B, topk_impl="xla"))
    tokens = np.concatenate([rng.integers(0, V, (S, 1)), np.asarray(t.tokens)], 1).astype(np.int32)
    par, n = np.asarray(t.parents), B + 1
    post = rng.integers(0, V, (S, n)).astype(np.int32)
    for s in range(S):
        for i in range(n):
            kids = [j for j in range(1, n) if par[s, j] == i]
            # stream 0's root always follows, so every case accepts beyond the root somewhere
            if kids and (rng.random() < follow or (s, i) == (0, 0)):
                post[s, i] = tokens[s, kids[rng.integers(len(kids))]]
            elif total is not None:
                post[s, i] = 0
    start = rng.integers(0, 11, S).astype(np.int32)
    M = 11 + n + 3
    active = rng.random(S) < 0.75
    active[0] = True
    kv = [rng.standard_normal((S, M, Dk)).astype(np.float32) for _ in range(layers)]
    taps = rng.standard_normal((S, n, W)).astype(np.float32)
    return t, tokens, post, start, active, kv, taps


# (S, L, V, B, follow): the engine's shape class (L 15, budget 64), padding nodes (V 2, L 2:
# only 6 prefixes for 10 slots), a single node, a chain (B = L, V large), walks that always follow
CASES = [(2, 15, 64, 64, 0.8), (3, 2, 2, 10, 0.7), (2, 4, 8, 1, 0.9), (3, 6, 500, 6, 0.95),
         (4, 5, 4, 20, 1.0)]


def _run_against_golden(impl, t, tokens, post, start, active, kv, taps):
    """tree_accept (`impl`, or the Pallas kernel with poisoned outputs) against the float64 golden,
    field by field; -> (got, want)."""
    args = (t, jnp.asarray(tokens), jnp.asarray(post), jnp.asarray(start), jnp.asarray(active),
            tuple(map(jnp.asarray, kv)), jnp.asarray(taps))
    got = (tree_accept_pallas(*args, poison=True) if impl == "pallas_poison"
           else tree_accept(*args, impl=impl))
    want = tree_accept_reference(np.asarray(t.parents), tokens, post, start, active, kv, taps,
                                 t.max_depth)
    for name, g, w in zip(("path", "accept_len", "bonus", "path_tokens"), got[:4], want[:4]):
        np.testing.assert_array_equal(np.asarray(g), w, err_msg=f"{impl} {name}")
    for layer, (g, w) in enumerate(zip(got[4], want[4])):
        np.testing.assert_array_equal(np.asarray(g), w, err_msg=f"{impl} kv layer {layer}")
    np.testing.assert_array_equal(np.asarray(got[5]), want[5], err_msg=f"{impl} path_taps")
    return got, want


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("impl", runnable_impls("tree_accept") + ["pallas_poison"])
def test_matches_golden(impl, case):
    _, want = _run_against_golden(impl, *_case(*case))
    assert want[1].max() > 1, "the case should accept beyond the root somewhere"


@pytest.mark.parametrize("impl", runnable_impls("tree_accept") + ["pallas_poison"])
def test_shared_budget_trees_never_enter_padding(impl):
    """Trees of a shared budget (4 nodes over 5 streams, at most 6 each: streams of 0 to 4 real
    nodes, then padding of token 0 and parent -1), with the target choosing token 0 wherever no
    real child follows: equal to the golden, and no path reaches past its stream's real nodes."""
    case = _case(5, 3, 8, 6, follow=0.9, total=4)
    t = case[0]
    got, _ = _run_against_golden(impl, *case)
    num_nodes = np.asarray(t.num_nodes)
    assert num_nodes.sum() == 4 and (num_nodes == 0).any()
    assert np.all(np.asarray(got[0]) <= num_nodes[:, None])
    assert np.all(np.asarray(got[1]) <= num_nodes + 1)


def test_bad_arguments_are_named():
    t, tokens, post, start, active, kv, taps = _case(2, 4, 8, 6)
    j = jnp.asarray
    good = dict(tokens=j(tokens), posterior=j(post), start=j(start), active=j(active),
                kv=tuple(map(j, kv)), taps=j(taps))
    for key, bad, match in (("posterior", j(post[:, :3]), "posterior must be"),
                            ("tokens", j(tokens.astype(np.float32)), "tokens must be integer"),
                            ("active", j(start), "active must be bool"),
                            ("kv", (j(kv[0]), j(kv[1][:, :5])), "kv must be"),
                            ("taps", j(taps[:1]), "taps must be")):
        with pytest.raises(ValueError, match=match):
            tree_accept(t, **(good | {key: bad}), impl="xla")
