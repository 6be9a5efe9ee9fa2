"""Record of session 28's run (log beside it); runs as is on a Hopper GPU.

Can a Pallas Mosaic GPU kernel read a peer CTA's shared memory in its cluster (cluster_ref)?

The question behind it: merging the split runs of mosaic_gpu's MLA kernel inside the kernel, the
runs of one stream as one cluster, instead of a separate merge kernel (3.5-6 us per call at 8k
decode, BENCHMARKS.md issue 5, session 27). Each CTA of a K-CTA cluster stages a [64, 64] bf16 tile
(tiled and swizzled as the MLA kernel's O staging) and a [64] float32 row vector in its shared
memory; after a cluster barrier, CTA r
reads tile and vector of peer (r + 1) % K and writes them out (a roll along K), checked against
numpy for K in {2, 4, 8}.
  PYTHONPATH=$PWD python3 <this file> [--lower_only]
"""
import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental.pallas import mosaic_gpu as plmg


def roll_kernel(x, v, *, k: int):
    """x [S, K, 64, 64] bf16, v [S, K, 64] f32 -> (x rolled by one along K, v rolled): CTA r of
    stream s's cluster returns peer (r + 1) % K's tile and vector."""
    num_s = x.shape[0]
    tiled = (plmg.TilingTransform((8, 64)), plmg.SwizzleTransform(128))

    def body(x_ref, v_ref, ox_ref, ov_ref, tile, vec, bar, done):
        s, r = lax.axis_index("stream"), lax.axis_index("cluster")
        plmg.copy_gmem_to_smem(x_ref.at[s, r], tile, bar)
        plmg.copy_gmem_to_smem(v_ref.at[s, r], vec, bar)
        plmg.barrier_wait(bar)
        plmg.barrier_arrive(done.at[0])          # every CTA's tile is in place
        plmg.barrier_wait(done.at[0])
        peer = lax.rem(r + 1, k)
        got = plmg.load(plmg.cluster_ref(tile, {"cluster": peer}), (), layout=plmg.Layout.WGMMA)
        gv = plmg.load(plmg.cluster_ref(vec, {"cluster": peer}), (),
                       layout=plmg.Layout.WGMMA.reduce(1))
        ox_ref[s, r] = got
        ov_ref[s, r] = gv
        plmg.barrier_arrive(done.at[1])          # no CTA exits while a peer may still read it
        plmg.barrier_wait(done.at[1])

    kernel = plmg.kernel(
        body,
        out_type=(jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)),
        grid=(num_s,), grid_names=("stream",), cluster=(k,), cluster_names=("cluster",),
        scratch_types=dict(tile=plmg.SMEM((64, 64), x.dtype, transforms=tiled),
                           vec=plmg.SMEM((64,), jnp.float32),
                           bar=plmg.Barrier(num_arrivals=2),
                           done=plmg.ClusterBarrier(collective_axes=("cluster",), num_barriers=2)),
    )
    return kernel(x, v)



def main(argv):
    lower_only = "--lower_only" in argv
    rng = np.random.default_rng(0)
    rows = []
    for k in (2, 4, 8):
        x = jnp.asarray(rng.standard_normal((3, k, 64, 64)), jnp.bfloat16)
        v = jnp.asarray(rng.standard_normal((3, k, 64)), jnp.float32)
        fn = jax.jit(functools.partial(roll_kernel, k=k))
        if lower_only:
            fn.trace(x, v).lower(lowering_platforms=("cuda",))
            print(f"K {k}: lowered")
            continue
        ox, ov = fn(x, v)
        ok = (np.array_equal(np.asarray(ox, np.float32), np.roll(np.asarray(x, np.float32), -1, axis=1))
              and np.array_equal(np.asarray(ov), np.roll(np.asarray(v), -1, axis=1)))
        rows.append((k, ok))
        print(f"K {k}: peer read {'equals' if ok else 'DIFFERS FROM'} numpy's roll", flush=True)
    print(f"device {jax.devices()[0].device_kind}  jax {jax.__version__}")
    return 0 if all(ok for _, ok in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
