"""Kernel block configurations by token count (written from experiments/kernel_bench.py --op=moe sweeps).

`config(T)` returns the entry of the smallest `max_tokens` >= T. Fields: bm (rows per block, the
routing alignment), bn_up / bn_down (output columns per program of the gate+up and down kernels),
num_warps, num_stages, dequant ("asm" on the GPU for bf16 and float16, else "bits"; "asm" needs bm
<= 32 or swap_ab: `dequant.py`). Variants of the Pallas
kernels (the raw "triton" kernels take scale_weights, f16, down_warps, down_stages and min_bm, and
ignore the others): scale_weights (group scale applied to the dequantised
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
min_bm: 0, or the fewest rows a Pallas program multiplies: a row block whose real rows fit in
bm / 2, bm / 4, ... >= min_bm rows runs a body of that many rows (one kernel holds every body), so
an expert with few slots in a bm-row block dequantises its weights once without the padding
rows' MMAs. A power of two in [16, bm / 2] (Triton's dot needs 16 rows).
f16: with INT4 experts whose scales are float16, multiply in float16 (`pallas_triton.f16_compute`:
bf16 activations scaled per row into range, half the error; 4-6% faster kernels on the H200 in
session 38, level with bf16 scales since session 44's fused dequantisation, whose row scaling
then costs 5-11% at T = 1, 4, 520, 1040);
False multiplies in the activations' dtype, the scales converted in the kernel (a variant for
benchmarks: offline more loop instructions than bf16 scales). On in every entry; ignored with
bf16 scales.
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
    min_bm: int = 0
    f16: bool = True

    def check(self) -> "MoEConfig":
        """self, or ValueError naming the field that no kernel can run."""
        for name in ("bm", "bn_up", "bn_down"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"MoEConfig.{name} must be a power of two, got {v}")
        if self.split_k < 1:
            raise ValueError(f"MoEConfig.split_k must be >= 1, got {self.split_k}")
        m = self.min_bm
        if m and (m & (m - 1) or not 16 <= m <= self.bm // 2):
            raise ValueError(f"MoEConfig.min_bm must be 0 or a power of two in [16, bm/2={self.bm // 2}], got {m}")
        if self.dequant == "asm" and self.bm >= 64 and not self.swap_ab:
            raise ValueError(f"MoEConfig.dequant='asm' needs bm <= 32 or swap_ab=True, got bm={self.bm}: on Hopper "
                             "Triton multiplies 64-row blocks with wgmma and dequantises their weight tile in a "
                             "layout whose register pairs are two columns, not the two K rows the PTX "
                             "dequantisation assumes (wrong results on the H200); use dequant='bits'")
        if self.dequant not in ("asm", "bits"):
            raise ValueError(f"MoEConfig.dequant must be 'asm' or 'bits', got {self.dequant!r}")
        return self


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
# Session 37 (experiments/results/moe_min_bm_h200_session37.md), device us per call: bm 16 /
# bm 32 / bm 32 with min_bm 16 at T = 520 3478 / 4256 / 3586, 640 3952 / 4342 / 3869, 768 4737 /
# 4363 / 4062, 1040 6262 / 4536 / 4584, 2048 - / 8609 / 8180, 4096 - / 14163 / 13914; at T = 256
# and 512 min_bm's 16-row body ran 5-6% behind the bm 16 kernel. So bm 16 up to about 590 tokens
# (the crossover between 520 and 640), bm 32 with min_bm 16 above.
# Session 38 (experiments/results/moe_f16_h200_session38_{bf16,f16}_scales.md), device us per call
# bf16 -> float16 compute: T = 16 965 -> 934, 64 2403 -> 2302, 256 3293 -> 3153, but T = 1
# 103.5 -> 108.0 (the row-scaling passes' ~5 us). Session 39 (moe_f16_h200_session39_*): T = 4
# 292 -> 287, 520 3544 -> 3456, 1040 4698 -> 4458, 2048 8113 -> 7929. f16 stays on in every
# entry: with f16 off, float16 scales are converted in the kernel, which offline costs more loop
# instructions than bf16 scales (T = 1 gate_up 523 vs 491, T = 1040 down 1677 vs 1582).
# Session 48 (experiments/results/moe_swap_ab_large_t_h200_session48/): swap_ab (wgmma) with bm 64 or
# 128 on the last entry, 1.12-1.74x slower at T = 2048 and 4096 (4096: 12,353 -> 15,072-17,629 us).
# Session 53 (experiments/results/moe_bn_up128_goal_t_h200_session53/): bn_up 64 -> 128 on the bm 16
# entry, raw kernels, device us per call burst / sustained (both power regimes): T = 16 726 / 776 ->
# 702 / 748, 64 1852 / 1981 -> 1746 / 1908, 256 2631 / 2832 -> 2505 / 2714, 4 225 / 225 -> 217 /
# 216, 520 2891 / 3186 -> 2676 / 3021; Pallas 1-3% slower in a burst at T = 16 and 64, faster
# sustained (T = 256: 2677 / 2879 -> 2580 / 2816). gate_up then has the down kernel's 128-column
# tile: half the activation re-reads per weight, 142 registers, no spills (ptx_stats).
# Session 54 (experiments/results/moe_table_h200_session54/): bn_up 64 -> 128 on the last entry too,
# raw kernels, device us per call, sustained (the 700 W cap): T = 1024 4116 / 4101 -> 3987 / 3992,
# 4096 12512 / 12579 -> 12044 / 12032 (Pallas 4143 -> 3953, 12591 -> 11780; session 52 agreed at
# 1040-4096); in a burst T = 4096 faster (11968 / 10957 -> 10331 / 10359), T = 1024 bimodal in both.
TABLE: tuple[tuple[int, MoEConfig], ...] = (
    (1, MoEConfig(bm=16, bn_up=32, bn_down=256, scale_weights=True)),
    (576, MoEConfig(bm=16, bn_up=128, bn_down=256, scale_weights=True)),  # T = 4-520; bn_up 128 since session 53
    (1 << 62, MoEConfig(bm=32, bn_up=128, bn_down=256, scale_weights=True, min_bm=16)),  # bn_up 128 since session 54
)


def config(num_tokens: int) -> MoEConfig:
    for max_tokens, cfg in TABLE:
        if num_tokens <= max_tokens:
            return cfg
    return TABLE[-1][1]
