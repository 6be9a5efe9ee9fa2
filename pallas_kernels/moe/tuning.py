"""Kernel block configurations by token count (written from experiments/kernel_bench.py --op=moe sweeps).

`config(T)` returns the entry of the smallest `max_tokens` >= T. Fields: bm (rows per block, the
routing alignment), bn_up / bn_down (output columns per program of the gate+up and down kernels),
num_warps, num_stages, dequant ("asm" on the GPU when bf16, else "bits"). Variants of the Pallas
kernels (the "triton" kernels ignore them): scale_weights (group scale applied to the dequantised
weights, one accumulator instead of a rescale per 32-row plane: on at every T, where the H200
measured it 1.2-1.6x at T = 16..1024), swap_ab (weight tile on the MMA's M side: measured
slower), split_k (K split over this many programs, float32 partial sums reduced in XLA: measured
slower at T = 1).
down_warps / down_stages: the down kernel's own warps and pipeline stages (0: num_warps /
num_stages); its K (= I = 2048) is 8 K blocks, a shorter loop than gate_up's 28.
cols_first: launch order of the Pallas kernels' programs, column tiles before row blocks, so
programs running together read adjacent column tiles of one expert's weight rows (default: row
blocks first, which at decode sizes means a different expert in each program). Measured equal
to the default at T = 1..256 (H200, session 17), so the table leaves it off.
"""

from __future__ import annotations

from typing import NamedTuple


class MoEConfig(NamedTuple):
    bm: int = 16
    bn_up: int = 64
    bn_down: int = 64
    num_warps: int = 4
    num_stages: int = 3
    dequant: str = "asm"
    scale_weights: bool = False
    swap_ab: bool = False
    split_k: int = 1
    down_warps: int = 0
    down_stages: int = 0
    cols_first: bool = False


# (max_tokens, config); the last entry covers every larger T. From the H200 sweep of 2026-11-30
# (experiments/results/moe_gemm.md): the fastest measured config per T; T <= 1024 from the
# "triton" run (the pallas sweep did not try it), the others from the pallas_triton sweep.
# scale_weights at T = 16, 64, 256 from the variants run of the same day (session 3,
# experiments/results/moe_variants_h200.md): 1594 -> 1282, 3963 -> 3010, 5505 -> 4210 us.
# T = 1 and 4 re-picked in session 4 with the fixed harness (the earlier sweep there was host-bound;
# experiments/results/moe_small_h200.md): asm + scale_weights, 180.5 -> 126.5 and 531.2 -> 325.6 us.
# Session 8 (experiments/results/moe_h200_session8.md): down kernel 256 columns wide at T <= 256
# (its K is only 8 blocks; wider tiles put more bytes in flight per program): down kernel at
# T = 256 1555-1654 -> 1129-1162 us, T = 1 41.6 -> 30.0, T = 4 121-144 -> 106.
# Session 9 (experiments/results/moe_large_t_h200_session9.md), T > 256, whose session-3 entries
# had never been re-tuned: T = 512 8265 -> 3604-3802 us with the T <= 256 config; T >= 1024
# bm 32, 64 / 256 columns, scale_weights: T = 1024 8554 -> 4908 us, T = 4096 ~30,300 (sum of
# the parts) -> 14,818 us.
TABLE: tuple[tuple[int, MoEConfig], ...] = (
    (1, MoEConfig(bm=16, bn_up=32, bn_down=256, scale_weights=True)),
    (512, MoEConfig(bm=16, bn_up=64, bn_down=256, scale_weights=True)),   # picked at T = 4, 16, 64, 256, 512
    (1 << 62, MoEConfig(bm=32, bn_up=64, bn_down=256, scale_weights=True)),
)


def config(num_tokens: int) -> MoEConfig:
    for max_tokens, cfg in TABLE:
        if num_tokens <= max_tokens:
            return cfg
    return TABLE[-1][1]
