"""Session-17 probe (issue 5): MLA two-pass pass 1's context tiles as a raw Triton kernel, with
and without TMA tensor descriptors (and warp specialisation), against cuBLAS on the same GEMM.
P = exp2(Q K^T * scale - rowmax) per [BM, BN] tile, bf16, with the tile's row max and row sum.
  GPU:     python3 tma_scores.py            (torch + triton on the device)
  offline: python3 tma_scores.py --offline  (compile for sm_90a, print registers / spills / TMA use)
Kept as run (session 17; BENCHMARKS.md issue 5, "Session 17"): on the device with its own torch and
Triton 3.6, `OUT=. python3 experiments/results/tma_scores_h200_session17.py`; offline with the pip
Triton venv, `/tmp/tvenv/bin/python experiments/results/tma_scores_h200_session17.py --offline`.
"""
import sys
import triton
import triton.language as tl

BM, BN, BK = 128, 256, 64


@triton.jit
def scores_ptr(q_ptr, k_ptr, p_ptr, m_ptr, l_ptr, R, C, scale,
               D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """q [S, R, D], k [S, C, D] -> p [S, R, C] bf16, m, l [S, R, C // BN] f32 (pointer loads)."""
    pid_m, pid_n, s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    ks = tl.arange(0, BK)
    q_base = q_ptr + s.to(tl.int64) * R * D
    k_base = k_ptr + s.to(tl.int64) * C * D
    acc = tl.zeros((BM, BN), tl.float32)
    for k0 in tl.range(0, D, BK):
        a = tl.load(q_base + rows[:, None] * D + (k0 + ks)[None, :])
        b = tl.load(k_base + cols[:, None] * D + (k0 + ks)[None, :])
        acc = tl.dot(a, tl.trans(b), acc)
    _epilogue(acc * scale, p_ptr, m_ptr, l_ptr, s, rows, cols, pid_n, R, C, BN)


@triton.jit
def scores_desc(q_desc, k_desc, p_desc, m_ptr, l_ptr, R, C, scale,
                D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                WS: tl.constexpr):
    """The same with host-side TMA descriptors over q [S*R, D], k [S*C, D], p [S*R, C]."""
    pid_m, pid_n, s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    acc = tl.zeros((BM, BN), tl.float32)
    for k0 in tl.range(0, D, BK, warp_specialize=WS):
        a = q_desc.load([s * R + pid_m * BM, k0])
        b = k_desc.load([s * C + pid_n * BN, k0])
        acc = tl.dot(a, b.T, acc)
    x = acc * scale
    m = tl.max(x, 1)
    p = tl.math.exp2(x - m[:, None])
    l = tl.sum(p, 1)
    p_desc.store([s * R + pid_m * BM, pid_n * BN], p.to(tl.bfloat16))
    rows = pid_m * BM + tl.arange(0, BM)
    nt = C // BN
    tl.store(m_ptr + (s * R + rows) * nt + pid_n, m)
    tl.store(l_ptr + (s * R + rows) * nt + pid_n, l)


@triton.jit
def _epilogue(x, p_ptr, m_ptr, l_ptr, s, rows, cols, pid_n, R, C, BN: tl.constexpr):
    m = tl.max(x, 1)
    p = tl.math.exp2(x - m[:, None])
    l = tl.sum(p, 1)
    base = s.to(tl.int64) * R
    tl.store(p_ptr + (base + rows[:, None]) * C + cols[None, :], p.to(tl.bfloat16))
    nt = C // BN
    tl.store(m_ptr + (base + rows) * nt + pid_n, m)
    tl.store(l_ptr + (base + rows) * nt + pid_n, l)


def offline():
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    tgt = GPUTarget("cuda", 90, 32)
    const = dict(D=576, BM=BM, BN=BN, BK=BK)
    sig_ptr = {"q_ptr": "*bf16", "k_ptr": "*bf16", "p_ptr": "*bf16", "m_ptr": "*fp32", "l_ptr": "*fp32",
               "R": "i32", "C": "i32", "scale": "fp32", "D": "constexpr", "BM": "constexpr", "BN": "constexpr", "BK": "constexpr"}
    sig_desc = {"q_desc": f"tensordesc<bf16[{BM}, {BK}]>", "k_desc": f"tensordesc<bf16[{BN}, {BK}]>",
                "p_desc": f"tensordesc<bf16[{BM}, {BN}]>", "m_ptr": "*fp32", "l_ptr": "*fp32",
                "R": "i32", "C": "i32", "scale": "fp32", "D": "constexpr", "BM": "constexpr", "BN": "constexpr",
                "BK": "constexpr", "WS": "constexpr"}
    cases = [("ptr", scores_ptr, sig_ptr, const, 3), ("desc", scores_desc, sig_desc, dict(const, WS=False), 3),
             ("desc_ws", scores_desc, sig_desc, dict(const, WS=True), 3)]
    for name, fn, sig, c, stages in cases:
        try:
            k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=c), target=tgt,
                               options=dict(num_warps=8, num_stages=stages))
            ptx = k.asm["ptx"]
            import os, re, subprocess, tempfile
            bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
            with tempfile.TemporaryDirectory() as d:
                open(f"{d}/k.ptx", "w").write(ptx)
                log = subprocess.run([f"{bin_dir}/ptxas", "-v", "--gpu-name", "sm_90a", f"{d}/k.ptx", "-o",
                                      f"{d}/k.cubin"], capture_output=True, text=True).stderr
            regs = re.search(r"Used (\d+) registers", log).group(1)
            spill = re.search(r"(\d+) bytes spill stores", log).group(1)
            print(name, "regs", regs, "spills", spill, "shared", k.metadata.shared,
                  "tma", ptx.count("cp.async.bulk.tensor"), "wgmma", ptx.count("wgmma.mma_async"),
                  "mma.sync", ptx.count("mma.sync"))
        except Exception as e:  # noqa: BLE001
            print(name, "FAILED", type(e).__name__, str(e)[:300])


def gpu():
    import torch
    from triton.testing import do_bench
    from triton.tools.tensor_descriptor import TensorDescriptor
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    torch.manual_seed(0)
    rows = []
    for S, R, C in ((16, 1024, 8192), (16, 4096, 8192), (8, 16384, 8192)):
        D = 576
        scale = 0.0625 * 1.4426950408889634
        q = torch.randn(S, R, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(S, C, D, device="cuda", dtype=torch.bfloat16)
        nt = C // BN
        ref = torch.bmm(q.float(), k.float().transpose(1, 2)) * scale
        ref = ref.view(S, R, nt, BN)
        rm = ref.amax(-1)
        rp = torch.exp2(ref - rm[..., None])
        rl = rp.sum(-1)
        flops = 2 * S * R * C * D
        grid = (R // BM, C // BN, S)
        res = {"S": S, "R": R, "C": C}
        for name in ("ptr", "desc", "desc_ws"):
            p = torch.full((S, R, C), float("nan"), device="cuda", dtype=torch.bfloat16)
            m = torch.full((S, R, nt), float("nan"), device="cuda")
            l = torch.full((S, R, nt), float("nan"), device="cuda")
            try:
                if name == "ptr":
                    call = lambda: scores_ptr[grid](q, k, p, m, l, R, C, scale, D=D, BM=BM, BN=BN, BK=BK,
                                                    num_warps=8, num_stages=3)
                else:
                    qd = TensorDescriptor.from_tensor(q.view(S * R, D), [BM, BK])
                    kd = TensorDescriptor.from_tensor(k.view(S * C, D), [BN, BK])
                    pd = TensorDescriptor.from_tensor(p.view(S * R, C), [BM, BN])
                    ws = name == "desc_ws"
                    call = lambda: scores_desc[grid](qd, kd, pd, m, l, R, C, scale, D=D, BM=BM, BN=BN, BK=BK,
                                                     WS=ws, num_warps=8, num_stages=3)
                call(); torch.cuda.synchronize()
                err_p = ((p.float().view(S, R, nt, BN) - rp).abs().max() / rp.abs().max()).item()
                err_m = ((m - rm).abs().max() / rm.abs().max()).item()
                err_l = ((l - rl).abs().max() / rl.abs().max()).item()
                ok = max(err_p, err_m, err_l) < 2e-2
                ms = do_bench(call, warmup=25, rep=200, return_mode="median") if ok else float("nan")
                res[name] = dict(ms=ms, tflops=flops / ms / 1e9, err=(err_p, err_m, err_l))
            except Exception as e:  # noqa: BLE001
                res[name] = dict(failed=f"{type(e).__name__}: {str(e)[:200]}")
        # cuBLAS on the same GEMM (no epilogue): the ceiling a Triton kernel is compared with
        ms = do_bench(lambda: torch.bmm(q, k.transpose(1, 2)), warmup=25, rep=200, return_mode="median")
        res["cublas_bmm"] = dict(ms=ms, tflops=flops / ms / 1e9)
        rows.append(res)
        print(res, flush=True)
    import json, os
    json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "tma_scores.json"), "w"), indent=1)
    print("| S | rows | ctx | ptr TF | desc TF | desc+ws TF | cuBLAS bmm TF |")
    for r in rows:
        f = lambda n: f"{r[n]['tflops']:.0f}" if "tflops" in r[n] else "fail"
        print(f"| {r['S']} | {r['R']} | {r['C']} | {f('ptr')} | {f('desc')} | {f('desc_ws')} | {f('cublas_bmm')} |")


if __name__ == "__main__":
    offline() if "--offline" in sys.argv else gpu()
