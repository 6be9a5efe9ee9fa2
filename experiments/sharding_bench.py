"""Verify-step time of the target sharded n ways against 1 way.

    PYTHONPATH=. python experiments/sharding_bench.py --preset=k2_slice --devices=1,2 \
        --budgets=16,64,256 --streams=1,4,16
    XLA_FLAGS=--xla_force_host_platform_device_count=2 JAX_PLATFORMS=cpu PYTHONPATH=. \
        python experiments/sharding_bench.py --preset=tiny --devices=1,2 --budgets=4 --streams=2 --reps=2

For each device count n, the first n devices form a mesh with n along --axis ("tensor": routed
experts, attention heads, MLP width and vocabulary all split n ways; "expert": only the routed
experts; "data": the streams). Per (n, budget B, streams S): the engine's verify forward (B+1
tokens per stream, a DDTree of random drafts, ancestor-only visibility, the drafter's taps) against
a cache holding --context tokens, jitted under the mesh; median of --reps timed calls after a
warm-up. Before an n-way point is timed, its logits must match the 1-way run's (same params and
inputs) within ddtree_jax.bench.parity.SHARDED_TOL (relative error 5e-2 in bfloat16, 1e-3 in float32);
the 1-way run comes first, untimed when 1 is not in --devices. Reported: ms per step, verified
tokens/s = S*(B+1) / step time, and that relative error. Multi-host: add
--coordinator, --num_processes, --process_id (docs/multihost.md).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from ddtree_jax import progress
import ddtree_jax as dj
from ddtree_jax import sharding
from ddtree_jax.bench import parity
from ddtree_jax.bench.timing import median_seconds
from ddtree_jax.model import aligned_slots

FLAGS = flags.FLAGS
flags.DEFINE_string("preset", "k2_slice", "ModelConfig preset")
flags.DEFINE_list("devices", ["1", "2"], "device counts n to compare")
flags.DEFINE_enum("axis", "tensor", ["data", "expert", "tensor"], "mesh axis the n devices go on")
flags.DEFINE_list("budgets", ["16", "64", "256"], "tree budgets B (B+1 verified tokens per stream)")
flags.DEFINE_list("streams", ["1", "4", "16"], "stream counts S")
flags.DEFINE_integer("context", 512, "tokens already in each stream's cache")
flags.DEFINE_integer("depth", 15, "draft depth L of the random trees")
flags.DEFINE_integer("reps", 10, "timed calls per point")
flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float32"], "parameter and cache dtype")
sharding.define_distributed_flags()
progress.flag()


@functools.partial(jax.jit, static_argnames=("cfg", "taps"))
def _verify(params, tokens, positions, cache, visibility, *, cfg, taps):
    out = dj.forward(params, cfg, tokens, positions, cache, visibility=visibility, taps=taps)
    return out.logits, out.taps


def _inputs(cfg, taps, streams: int, budget: int, dtype, seed: int = 0):
    """Tokens [S, B+1], positions, visibility of a DDTree over random drafts, a cache at --context."""
    rng = np.random.default_rng(seed)
    draft = jnp.asarray(rng.normal(size=(streams, FLAGS.depth, cfg.vocab_size)) * 3, jnp.float32)
    tree = dj.build_tree(draft, budget)
    root = jnp.asarray(rng.integers(0, cfg.vocab_size, (streams, 1)), jnp.int32)
    tokens = jnp.concatenate([root, tree.tokens], axis=1)
    positions = FLAGS.context + jnp.concatenate([jnp.zeros_like(root), tree.depths], axis=1)
    cache = dj.init_cache(cfg, streams, aligned_slots(FLAGS.context + budget + 1), dtype)
    cache = cache.replace(lengths=jnp.full((streams,), FLAGS.context, jnp.int32))
    return tokens, positions, cache, tree.visibility


def main(argv):
    del argv
    sharding.initialize_from_flags()
    cfg = dj.ModelConfig.preset(FLAGS.preset)
    taps = dj.DrafterConfig.for_target(cfg).target_layer_ids
    dtype = jnp.dtype(FLAGS.dtype)
    print(f"{FLAGS.preset} on {jax.device_count()} x {jax.devices()[0].device_kind}, "
          f"context {FLAGS.context}, mesh axis {FLAGS.axis!r}")
    print("| devices | budget | streams | ms / step | verified tokens/s | logits error vs 1 way |")
    print("|---|---|---|---|---|---|")
    counts = [int(d) for d in FLAGS.devices]
    check = any(n != 1 for n in counts)
    reference = {}   # (budget, streams) -> the 1-way logits, which each n-way run must reproduce
    for n in ([1] if check or 1 in counts else []) + [n for n in counts if n != 1]:
        shape = tuple(n if a == FLAGS.axis else 1 for a in sharding.AXES)
        mesh = sharding.make_mesh(shape)
        params = dj.init_target(cfg, jax.random.key(0), dtype, mesh=mesh)
        verify = functools.partial(_verify, cfg=cfg, taps=taps)
        with jax.set_mesh(mesh):
            for budget in progress.track([int(b) for b in FLAGS.budgets], f"{n}-way", FLAGS.progress):
                for streams in (int(s) for s in FLAGS.streams):
                    args = _inputs(cfg, taps, streams, budget, dtype)
                    err = 0.0
                    if check:   # before timing: the n-way logits against the 1-way run's
                        logits = np.asarray(verify(params, *args)[0])
                        if n == 1:
                            reference[(budget, streams)] = logits
                        else:
                            err = parity.check_sharded(
                                f"{n}-way verify logits (budget {budget}, {streams} streams)",
                                logits, reference[(budget, streams)], dtype)
                    if n not in counts:
                        continue
                    t = median_seconds(verify, params, *args, reps=FLAGS.reps)
                    print(f"| {n} | {budget} | {streams} | {t * 1e3:.2f} | "
                          f"{streams * (budget + 1) / t:.0f} | {err:.2g} |", flush=True)
        del params


if __name__ == "__main__":
    app.run(main)
