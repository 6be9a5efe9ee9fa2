"""Sharded runs equal unsharded ones, on simulated CPU devices (run by tests/framework/test_sharding.py):

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m tests.sharding_checks 1,8,1 1,2,4:generate

Each argument is a (data, expert, tensor) mesh; ":generate" adds a full greedy DDTree generate and
the same requests served through 2 slots (dj.serve).
Per mesh: parameter shardings are the rules' and each device holds only its slice; init and
load_target under the mesh give the unsharded values bit for bit; the target forward (logits, cache, taps), the drafter
forward and draft logits, and build_tree equal the unsharded results (float32, 1e-5 relative);
the routed experts equal the 1-device call and each device computes only its own slots' rows and
streams only the experts they hit; generate emits identical tokens. Prints "ok <check> <mesh>" per check; exits non-zero on failure.
"""

from __future__ import annotations

import functools
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import ddtree_jax as dj
from ddtree_jax import drafter as dft
from ddtree_jax import sharding
from pallas_kernels.moe import moe_experts

jax.config.update("jax_default_matmul_precision", "highest")

CFG = dj.ModelConfig.preset("tiny", num_hidden_layers=2)   # dense + MoE; 4 heads, 16 experts, V 512
DCFG = dj.DrafterConfig.for_target(CFG, block_size=4, num_hidden_layers=1)
S, T, BUDGET = 8, 6, 8


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def _close(name, got, want, tol=1e-5):
    err = _rel(got, want)
    if err > tol:
        raise AssertionError(f"{name}: relative error {err:.3g} > {tol}")


def _expected_specs(shape) -> dict[str, P]:
    """What the rules say for a few parameters, written out by hand for this mesh."""
    data, expert, tensor = shape
    t = "tensor" if tensor > 1 else None
    experts = (("expert", "tensor") if expert > 1 and tensor > 1 else
               "expert" if expert > 1 else t)
    return {
        "embed_tokens/embedding": P(t, None), "lm_head/kernel": P(None, t),
        "layers_1/mlp/experts/gate_kernel": P(experts, None, None),
        "layers_1/self_attn/q_b_proj/kernel": P(None, t), "layers_1/self_attn/kv_b_proj/kernel": P(None, t),
        "layers_1/self_attn/o_proj/kernel": P(t, None), "layers_0/mlp/down_proj/kernel": P(t, None),
        "layers_1/mlp/shared_experts/up_proj/kernel": P(None, t),
        "layers_1/self_attn/kv_a_proj_with_mqa/kernel": P(None, None), "norm/scale": P(None),
        "layers_1/mlp/gate/kernel": P(None, None),
    }


def check_params(mesh, shape, tp, dp, tp_sh, dp_sh, tp_loaded):
    for ref, got in ((tp, tp_sh), (dp, dp_sh), (tp, tp_loaded)):
        for (kp, a), b in zip(jax.tree_util.tree_flatten_with_path(ref)[0], jax.tree.leaves(got)):
            path = sharding.path_str(kp)
            want = sharding.spec(sharding.param_logical_axes(path, b.ndim), b.shape, mesh)
            if b.sharding.spec != want:
                raise AssertionError(f"{path}: sharding {b.sharding.spec}, rules say {want}")
            local = b.sharding.shard_shape(b.shape)
            if any(s.data.shape != local for s in b.addressable_shards):
                raise AssertionError(f"{path}: a device holds more than its slice {local}")
            if not np.array_equal(np.asarray(a), np.asarray(b)):
                raise AssertionError(f"{path}: sharded init / load differs from the unsharded params")
    flat = {sharding.path_str(kp): x for kp, x in jax.tree_util.tree_flatten_with_path(tp_sh)[0]}
    for path, want in _expected_specs(shape).items():
        if flat[path].sharding.spec != want:
            raise AssertionError(f"{path}: sharding {flat[path].sharding.spec}, expected {want}")


@jax.jit
def run_target(tp, tokens):
    cache = dj.init_cache(CFG, S, 2 * T)
    pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (S, T))
    out = dj.forward(tp, CFG, tokens, pos, cache, taps=DCFG.target_layer_ids)
    # a second call verifies a tree-shaped block against the filled cache
    vis = jnp.asarray(np.random.default_rng(1).random((S, T, T)) < 0.5) | jnp.eye(T, dtype=bool)
    out2 = dj.forward(tp, CFG, tokens, pos + T, out.cache, visibility=vis, taps=DCFG.target_layer_ids)
    return out.logits, out.taps, out2.logits, out2.cache.kv[1]


@jax.jit
def run_drafter(tp, dp, taps, tokens):
    emb = dft.block_embedding(tp, DCFG, tokens[:, 0])
    pos = jnp.broadcast_to(jnp.arange(T + DCFG.block_size, dtype=jnp.int32), (S, T + DCFG.block_size))
    hidden = dj.drafter_hidden(dp, DCFG, taps, emb, pos)
    return hidden, dft.draft_logits(tp, hidden[:, 1:])


def run_tree(logits):
    tree = dj.build_tree(logits, BUDGET)
    return tree.tokens, tree.parents, tree.depths, tree.visibility, tree.scores


def check_expert_work(shape, experts, tp_experts, rng):
    """The routed experts under the mesh: outputs equal the 1-device call's, and each device's
    shard computes exactly its own slots (rows: valid slots routed to its experts, from its token
    shard) and streams exactly the experts they hit (`sharding.moe_shard_work`)."""
    e, k, t = CFG.n_routed_experts, CFG.num_experts_per_tok, 4 * S
    ids = np.stack([rng.choice(e, k, replace=False) for _ in range(t)]).astype(np.int32)
    valid = rng.random((t, k)) < 0.8
    x = jnp.asarray(rng.normal(size=(t, CFG.hidden_size)), jnp.float32)
    w = jnp.asarray(rng.random((t, k)), jnp.float32)
    fn = functools.partial(moe_experts, impl="xla")
    want = fn(x, jnp.asarray(ids), w, tp_experts, jnp.asarray(valid))
    got = sharding.moe_experts(fn, x, jnp.asarray(ids), w, experts, jnp.asarray(valid))
    _close(f"moe experts {shape}", got, want)
    work = np.asarray(sharding.moe_shard_work(jnp.asarray(ids), jnp.asarray(valid), e))
    token_shards, expert_shards = work.shape[:2]
    n_local = e // expert_shards
    for d, (tid, tok) in enumerate(zip(np.split(ids, token_shards), np.split(valid, token_shards))):
        for s in range(expert_shards):
            mine = tok & (tid // n_local == s)
            expect = (int(mine.sum()), len(np.unique(tid[mine])))
            if tuple(work[d, s]) != expect:
                raise AssertionError(f"moe shard work {shape}: device ({d}, {s}) computes (rows, experts) "
                                     f"{tuple(work[d, s])}, its routing has {expect}")
    if work[..., 0].sum() != valid.sum():
        raise AssertionError(f"moe shard work {shape}: {work[..., 0].sum()} rows for {valid.sum()} slots")


def run_generate(target, drafter, prompts):
    return dj.generate(target, drafter, prompts, method="ddtree", budget=BUDGET, max_new_tokens=10,
                       stage_reps=0).tokens


_T0 = [time.perf_counter()]


def _ok(check, shape):
    now = time.perf_counter()
    print(f"ok {check} {shape} {now - _T0[0]:.1f}s", flush=True)
    _T0[0] = now


def main(argv):
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, CFG.vocab_size, (S, T)), jnp.int32)
    prompts = [rng.integers(0, CFG.vocab_size, int(n)).tolist() for n in rng.integers(2, 9, S)]
    tp = dj.init_target(CFG, jax.random.key(0))
    dp = dj.init_drafter(DCFG, jax.random.key(1))
    ref_t = run_target(tp, tokens)
    ref_d = run_drafter(tp, dp, ref_t[1], tokens)
    draft = jnp.asarray(rng.normal(size=(S, DCFG.block_size - 1, CFG.vocab_size)) * 3, jnp.float32)
    ref_tree = run_tree(draft)
    ref_gen = None
    ckpt = tempfile.mkdtemp()
    dj.save_target_hf(ckpt, CFG, tp)
    _ok("unsharded references", ())
    for arg in argv:
        shape = sharding.MeshConfig.parse(arg.split(":")[0]).shape
        mesh = sharding.make_mesh(shape)
        tp_sh = dj.init_target(CFG, jax.random.key(0), mesh=mesh)
        dp_sh = dj.init_drafter(DCFG, jax.random.key(1), mesh=mesh)
        _, tp_loaded = dj.load_target(ckpt, dtype=jnp.float32, mesh=mesh)
        check_params(mesh, shape, tp, dp, tp_sh, dp_sh, tp_loaded)
        _ok("params", shape)
        with jax.set_mesh(mesh):
            got_t = run_target(tp_sh, tokens)
            for name, g, w in zip(("logits", "taps", "tree logits", "cache"), got_t, ref_t):
                _close(f"target {name} {shape}", g, w)
            _ok("target", shape)
            for name, g, w in zip(("hidden", "draft logits"), run_drafter(tp_sh, dp_sh, got_t[1], tokens),
                                  ref_d):
                _close(f"drafter {name} {shape}", g, w)
            _ok("drafter", shape)
            sharded = jax.device_put(draft, jax.sharding.NamedSharding(
                mesh, sharding.spec(("streams", None, "vocab"), draft.shape, mesh)))
            got_tree = run_tree(sharded)
            for name, g, w in zip(("tokens", "parents", "depths", "visibility"), got_tree, ref_tree):
                if not np.array_equal(np.asarray(g), np.asarray(w)):
                    raise AssertionError(f"tree {name} {shape} differs")
            _close(f"tree scores {shape}", got_tree[-1], ref_tree[-1])
            _ok("tree", shape)
            check_expert_work(shape, tp_sh["layers_1"]["mlp"]["experts"], tp["layers_1"]["mlp"]["experts"], rng)
            _ok("moe_ep", shape)
            if arg.endswith(":generate"):
                got = run_generate((CFG, tp_sh), (DCFG, dp_sh), prompts)
                ref_gen = ref_gen or run_generate((CFG, tp), (DCFG, dp), prompts)
                if got != ref_gen:
                    raise AssertionError(f"generate {shape}: {got} != {ref_gen}")
                _ok("generate", shape)
                served = dj.serve((CFG, tp_sh), (DCFG, dp_sh), prompts, streams=2, method="ddtree",
                                  budget=BUDGET, max_new_tokens=10).tokens
                if served != ref_gen:
                    raise AssertionError(f"serve {shape}: {served} != {ref_gen}")
                _ok("serve", shape)
    return 0


if __name__ == "__main__":
    if jax.device_count() < 8:
        sys.exit(f"needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8), "
                 f"found {jax.device_count()}")
    sys.exit(main(sys.argv[1:]))
