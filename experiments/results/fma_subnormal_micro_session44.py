"""Micro check (BENCHMARKS.md, issue 4, session 44): do fma.rn.f16x2 / fma.rn.bf16x2 keep
subnormal inputs on the GPU, as the fused INT4 dequantisation (ptx.asm_source_fused) needs?
1024 pairs per type: a = a nibble at bit 0 or 4 with no exponent (a subnormal, or for bf16 at
bit 4 possibly the first normal binade), b = s * 2^(E - b - M), c = -8 s 2^-M (scales uniform in
[0.004, 0.01]); the hardware against float64 math rounded once, and against (n - 8) s 2^-M.
GPU only (torch + triton): python3 experiments/results/fma_subnormal_micro_session44.py"""
import ml_dtypes
import numpy as np
import torch
import triton
import triton.language as tl


@triton.jit
def k(a_ptr, b_ptr, c_ptr, o_ptr, ASM: tl.constexpr):
    i = tl.arange(0, 1024)
    a, b, c = tl.load(a_ptr + i), tl.load(b_ptr + i), tl.load(c_ptr + i)
    o = tl.inline_asm_elementwise(ASM, "=r,r,r,r", [a, b, c], dtype=tl.int32, is_pure=True, pack=1)
    tl.store(o_ptr + i, o)


rng = np.random.default_rng(0)
for kind, dt, bias in (("f16x2", np.float16, 24), ("bf16x2", ml_dtypes.bfloat16, 133)):
    nib = rng.integers(0, 16, (1024, 2))
    sh = rng.choice([0, 4], (1024, 1))
    a16 = (nib << sh).astype(np.uint16)
    s = rng.uniform(0.004, 0.01, (1024, 2))
    m = 6 if kind == "f16x2" else 32
    mult = (s.astype(dt).astype(np.float64) * 2.0 ** (bias - sh - m)).astype(dt)
    off = (-8 * s.astype(dt).astype(np.float64) * 2.0 ** -m).astype(dt)
    pack = lambda v16: (v16[:, 0].astype(np.uint32) | v16[:, 1].astype(np.uint32) << 16).view(np.int32)
    A = pack(a16)
    B = pack(mult.view(np.uint16))
    C = pack(off.view(np.uint16))
    out = torch.empty(1024, dtype=torch.int32, device="cuda")
    t = lambda x: torch.from_numpy(x).cuda()
    k[(1,)](t(A), t(B), t(C), out, ASM=f"fma.rn.{kind} $0, $1, $2, $3;")
    got = out.cpu().numpy().view(np.uint32)
    got16 = np.stack([got & 0xFFFF, got >> 16], 1).astype(np.uint16).view(dt).astype(np.float64)
    aval = a16.view(dt).astype(np.float64)
    want = (aval * mult.astype(np.float64) + off.astype(np.float64)).astype(dt).astype(np.float64)
    exact = ((nib - 8) * s.astype(dt).astype(np.float64)).astype(dt).astype(np.float64) * 2.0 ** -m
    print(kind, "a as float (first 4):", aval[:2].ravel(), "hw == fma math:", np.array_equal(got16, want),
          "hw == (n-8)s 2^-m:", np.array_equal(got16, exact), "mismatches:", int((got16 != exact).sum()))
