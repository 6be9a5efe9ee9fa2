"""Kernel block configurations of moe_experts by token count.

`config(T)` returns the entry of TABLE with the smallest `max_tokens` >= T. The Pallas kernels read
every field; the raw "triton" kernels ignore swap_ab, split_k and cols_first. Why the table holds
what it does, and the variants measured against it: docs/kernels/moe.md.

Fields:
- bm: rows per block, the routing alignment.
- bn_up / bn_down: output columns per program of the gate+up and down kernels.
- num_warps / num_stages: warps and software-pipeline stages per program.
- dequant: "asm" (inline PTX; GPU only, bf16 and float16 activations) or "bits" (lax bit ops).
  "asm" needs bm <= 32 or swap_ab (`dequant.py`).
- scale_weights: the group scale multiplies the dequantised weights, so every plane accumulates
  into one float32 accumulator, instead of rescaling each 32-row plane's float32 dot output.
- swap_ab: the weight tile on the MMA's M side (Triton then emits wgmma).
- split_k: K split over this many programs, float32 partial sums reduced in XLA.
- down_warps / down_stages: the down kernel's own warps and stages (0: num_warps / num_stages);
  its K (= I) is a shorter loop than gate_up's (8 K blocks against 28 at Kimi-K2's shape).
- cols_first: launch column tiles before row blocks, so programs running together read adjacent
  column tiles of one expert's weight rows (default: row blocks first).
- min_bm: 0, or the fewest rows a program multiplies: a row block whose real rows fit in bm / 2,
  bm / 4, ... >= min_bm rows runs a body of that many rows (one kernel holds every body), so an
  expert with few slots in a bm-row block dequantises its weights once without the padding rows'
  MMAs. A power of two in [16, bm / 2] (Triton's dot needs 16 rows).
- f16: with INT4 experts whose scales are float16, multiply in float16
  (`pallas_triton.f16_compute`: bf16 activations scaled per row into range, half the error);
  False multiplies in the activations' dtype and converts the scales in the kernel. Ignored with
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


# (max_tokens, config); the last entry covers every larger T. 16-row blocks up to T = 576 (about
# 12 slots per expert at top-8 over 384 experts; above, an expert's rows span two 16-row blocks,
# which dequantise the same weights twice), 32-row blocks with 16-row bodies above; scale_weights
# everywhere; gate_up 128 columns except at T = 1; down 256 columns.
TABLE: tuple[tuple[int, MoEConfig], ...] = (
    (1, MoEConfig(bm=16, bn_up=32, bn_down=256, scale_weights=True)),
    (576, MoEConfig(bm=16, bn_up=128, bn_down=256, scale_weights=True)),  # T = 2-576
    (1 << 62, MoEConfig(bm=32, bn_up=128, bn_down=256, scale_weights=True, min_bm=16)),  # T > 576
)


def config(num_tokens: int) -> MoEConfig:
    for max_tokens, cfg in TABLE:
        if num_tokens <= max_tokens:
            return cfg
    return TABLE[-1][1]
