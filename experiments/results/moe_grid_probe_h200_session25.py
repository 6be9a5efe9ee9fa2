"""What the INT4 MoE kernels' unused programs cost (session 25).

The routing alignment's block count is the worst case over all routings (align.max_blocks), so at
the K2 layer shape most row blocks of a call carry expert -1 and their programs exit at once: at
T = 16 (tuned bm 16) 128 blocks of which ~111 are used, at T = 64 416 blocks, ~280 used. Per T
and kernel (tuned config, one random routing), device time by the profiler trace of:
- full:    the call as moe_experts_pallas makes it;
- compact: the same call with only the used blocks (block_expert and row_token cut after the last
           used block; the used blocks come first), i.e. what a grid sized to the routing would take;
- empty:   the full grid with every block marked unused (the unused programs' cost alone).

  python3 experiments/results/moe_grid_probe_h200_session25.py [T ...] > $OUT/grid.log
"""
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

from ddtree_jax import bench_util
from pallas_kernels.moe import int4, tuning
from pallas_kernels.moe import pallas_triton as pt
from pallas_kernels.moe.experts import dims

E, D, I, K = 384, 7168, 2048, 8


def experts(key):
    out, keys = {}, jax.random.split(key, 6)
    for j, (name, kk, n) in enumerate((("gate", D, I), ("up", D, I), ("down", I, D))):
        out[f"{name}_qweight"] = jax.lax.bitcast_convert_type(
            jax.random.bits(keys[2 * j], (E, kk // 8, n), jnp.uint32), jnp.int32)
        out[f"{name}_qscale"] = jax.random.uniform(keys[2 * j + 1], (E, kk // 32, n), minval=0.004,
                                                   maxval=0.01).astype(jnp.bfloat16)
    return out


def main():
    ex = experts(jax.random.key(0))
    dm = dims(ex)
    rows = []
    for t in map(int, sys.argv[1:] or (1, 16, 64, 256)):
        cfg = tuning.config(t)
        kid, kw, kx = jax.random.split(jax.random.key(t), 3)
        ids = jnp.argsort(jax.random.uniform(kid, (t, E)), axis=-1)[:, :K].astype(jnp.int32)
        w = jax.random.uniform(kw, (t, K), minval=0.1, maxval=1.0)
        x = jax.random.normal(kx, (t, D), jnp.bfloat16)
        r, row_token, row_weight = pt.routed_rows(ids, w, E, cfg.bm)
        be = np.asarray(r.block_expert)
        used = int((be >= 0).sum())
        assert np.all(be[:used] >= 0) and np.all(be[used:] < 0)
        # the weights are arguments, not closed-over constants (those would be embedded in the HLO)
        gate_up = jax.jit(lambda x, rt, be, ex: pt.gate_up(x, rt, be, ex, dm, cfg))
        down = jax.jit(lambda h, rt, rw, be, ex: pt.down(h, rt, rw, be, ex, dm, cfg))
        h = gate_up(x, row_token, r.block_expert, ex)
        cut = used * cfg.bm
        forms = {"full": (row_token, row_weight, r.block_expert),
                 "compact": (row_token[:cut], row_weight[:cut], r.block_expert[:used]),
                 "empty": (row_token, row_weight, jnp.full_like(r.block_expert, -1))}
        # the compact grid computes the same rows: check it before timing
        hc = gate_up(x, *forms["compact"][::2], ex)
        real = np.asarray(row_token[:cut]) >= 0
        assert np.array_equal(np.asarray(h[:cut])[real], np.asarray(hc)[real])
        y = down(h, row_token, row_weight, r.block_expert, ex)
        yc = down(hc, *forms["compact"], ex)
        assert np.array_equal(np.asarray(y[:cut])[real], np.asarray(yc)[real])
        for form, (rt, rw, b) in forms.items():
            g = bench_util.traced_device_time(gate_up, x, rt, b, ex, calls=20)
            hh = h if form != "compact" else hc
            dn = bench_util.traced_device_time(down, hh, rt, rw, b, ex, calls=20)
            rows.append(dict(T=t, blocks=int(be.size), used=used, form=form, programs_gate_up=int(b.size) * (I // cfg.bn_up),
                             gate_up_us=g["busy_us"], down_us=dn["busy_us"]))
            print(json.dumps(rows[-1]), flush=True)
    print(f"device {jax.devices()[0].device_kind}  jax {jax.__version__}")
    print(bench_util.markdown_table(rows, ["T", "blocks", "used", "form", "gate_up_us", "down_us"]))


if __name__ == "__main__":
    sys.exit(main())
