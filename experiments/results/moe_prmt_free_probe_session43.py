"""Probe (BENCHMARKS.md, issue 4, session 43): the raw Triton MoE kernels on a PRMT-free INT4 word
layout, timed against the shipped kernels in one process. GPU only, from the repository root:
  python3 experiments/results/moe_prmt_free_probe_session43.py --tokens=16,64,256 --scale_dtype=float16 --min_time_s=0.3

The kernels' dequantisation takes the two words of one register pair of the MMA's B operand
(rows r, r+1 of a [32, BN] word tile, r even: TTGIR shows the asm on a dot_op kWidth=2 layout) and
gathers the byte holding plane j of each with a `prmt` before masking it. Repacking each row pair
(a, b) as a' = a[0:16] | b[0:16] << 16 (planes 0-3 of both rows), b' = a[16:32] | b[16:32] << 16
(planes 4-7) puts both nibbles of a plane in one word, 16 bits apart: planes 0, 1, 4, 5 need no
byte move at all, planes 2, 3, 6, 7 one `shr` (the prmt's place). Variants:
  base  the shipped kernels on the shipped layout
  pf    PRMT-free layout, one asm block per plane
  pf2   PRMT-free layout, planes (2, 3) and (6, 7) from one asm block sharing the shift
Each variant's output is checked bitwise against base's (same values, same accumulation order) and
base against the xla path, before timing; timing rounds interleave the variants. Written against
9d8734c, whose shipped kernels are "base"; since the commit after it they are "pf" (the layout and
PTX of int4.py / ptx.py), so this probe documents that measurement and is not meant to run again.
"""
import functools
import importlib.util
import json
import os
import sys
import tempfile

sys.path.insert(0, os.getcwd())

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from ddtree_jax import bench_util  # noqa: E402
from experiments.kernel_bench import _routings, _time  # noqa: E402
from pallas_kernels.moe import int4, triton_impl, tuning  # noqa: E402
from pallas_kernels.moe.experts import dims as expert_dims  # noqa: E402
from pallas_kernels.moe.pallas_triton import slot_experts  # noqa: E402
from pallas_kernels.moe.xla import moe_experts_xla  # noqa: E402

# kernel_bench's flags --tokens, --scale_dtype, --min_time_s apply; these are the probe's own
flags.DEFINE_list("pf_variants", ["base", "pf", "pf2"], "variants to time")
flags.DEFINE_integer("pf_rounds", 3, "interleaved timing rounds")
flags.DEFINE_string("pf_out", "", "JSON lines here")
FLAGS = flags.FLAGS


def pf_source(j: int, f16: bool) -> str:
    """PTX: plane j of a PRMT-free word pair ($1 planes 0-3, $2 planes 4-7; row r in the low
    halves, r + 1 in the high) -> 16-bit pair $0, times the x2 scales $3."""
    w, jj = ("$1" if j < 4 else "$2"), j % 4
    lines = ["{", ".reg .b32 q, m, c;"]
    if f16:
        src = w
        if jj >= 2:
            lines.append(f"shr.u32 q, {w}, 8;")
            src = "q"
        lines.append(f"lop3.b32 $0, {src}, {'0x00F000F0' if jj % 2 else '0x000F000F'}, 0x64006400, 0xEA;")
        if jj % 2:
            lines += ["mov.b32 m, 0x2C002C00;", "mov.b32 c, 0xD480D480;", "fma.rn.f16x2 $0, $0, m, c;"]
        else:
            lines += ["mov.b32 c, 0xE408E408;", "add.rn.f16x2 $0, $0, c;"]
        lines.append("mul.rn.f16x2 $0, $0, $3;")
    else:
        src = w
        if jj:
            lines.append(f"shr.u32 q, {w}, {4 * jj};")
            src = "q"
        lines += [f"lop3.b32 $0, {src}, 0x000F000F, 0x43004300, 0xEA;", "mov.b32 m, 0x3F803F80;",
                  "mov.b32 c, 0xC308C308;", "fma.rn.bf16x2 $0, $0, m, c;", "mov.b32 c, 0x80008000;",
                  "fma.rn.bf16x2 $0, $0, $3, c;"]
    return "\n".join(lines + ["}"])


def pf2_source(j: int, f16: bool) -> str:
    """PTX: planes j, j + 1 (j = 2 or 6) -> $0, $1 from words $2, $3, scales $4, $5; one shift."""
    w = "$2" if j < 4 else "$3"
    lines = ["{", ".reg .b32 q, m, c;", f"shr.u32 q, {w}, 8;"]
    if f16:
        lines += ["lop3.b32 $0, q, 0x000F000F, 0x64006400, 0xEA;", "mov.b32 c, 0xE408E408;",
                  "add.rn.f16x2 $0, $0, c;", "mul.rn.f16x2 $0, $0, $4;",
                  "lop3.b32 $1, q, 0x00F000F0, 0x64006400, 0xEA;", "mov.b32 m, 0x2C002C00;",
                  "mov.b32 c, 0xD480D480;", "fma.rn.f16x2 $1, $1, m, c;", "mul.rn.f16x2 $1, $1, $5;"]
    else:
        lines += ["mov.b32 m, 0x3F803F80;", "mov.b32 c, 0xC308C308;",
                  "lop3.b32 $0, q, 0x000F000F, 0x43004300, 0xEA;", "fma.rn.bf16x2 $0, $0, m, c;",
                  "shr.u32 q, q, 4;", "lop3.b32 $1, q, 0x000F000F, 0x43004300, 0xEA;",
                  "fma.rn.bf16x2 $1, $1, m, c;", "mov.b32 c, 0x80008000;",
                  "fma.rn.bf16x2 $0, $0, $4, c;", "fma.rn.bf16x2 $1, $1, $5, c;"]
    return "\n".join(lines + ["}"])


NEW_FUNCS = '''
_PF16 = tl.constexpr(PF16)
_PBF16 = tl.constexpr(PBF16)
_PF16_2 = tl.constexpr(PF16_2)
_PBF16_2 = tl.constexpr(PBF16_2)
_PAIR = tl.constexpr(PAIR)


@triton.jit
def _plane(wq, s, J: tl.constexpr, ASM_ON: tl.constexpr, SCALE_W: tl.constexpr):
    sb = tl.broadcast_to(s[None, :], wq.shape)
    if s.dtype == tl.float16:
        p = tl.inline_asm_elementwise(_PF16[J], "=r,r,r,r", [wq, sb], dtype=tl.float16, is_pure=True, pack=2)
    else:
        p = tl.inline_asm_elementwise(_PBF16[J], "=r,r,r,r", [wq, sb], dtype=tl.bfloat16, is_pure=True, pack=2)
    return p


@triton.jit
def _plane2(wq, s, s1, J: tl.constexpr):
    sb = tl.broadcast_to(s[None, :], wq.shape)
    sb1 = tl.broadcast_to(s1[None, :], wq.shape)
    if s.dtype == tl.float16:
        p, p1 = tl.inline_asm_elementwise(_PF16_2[J // 4], "=r,=r,r,r,r,r", [wq, sb, sb1],
                                          dtype=(tl.float16, tl.float16), is_pure=True, pack=2)
    else:
        p, p1 = tl.inline_asm_elementwise(_PBF16_2[J // 4], "=r,=r,r,r,r,r", [wq, sb, sb1],
                                          dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=2)
    return p, p1


@triton.jit
def _k_block(acc0, acc1, a_row, real, kb, w0, s0, w1, s1, cols, N, NP: tl.constexpr, TWO: tl.constexpr,
             INT4: tl.constexpr, ASM_ON: tl.constexpr, SCALE_W: tl.constexpr):
    r = tl.arange(0, 32)
    k0 = kb * 256
    dt = a_row.dtype.element_ty
    q0 = tl.load(w0 + (kb * 32 + r)[:, None] * N + cols[None, :])
    ss0 = _scale_planes(s0, kb, cols, N, NP, dt)
    if TWO:
        q1 = tl.load(w1 + (kb * 32 + r)[:, None] * N + cols[None, :])
        ss1 = _scale_planes(s1, kb, cols, N, NP, dt)
    for j in tl.static_range(NP):
        if (not _PAIR) or (j % 4 < 2):
            a = tl.load(a_row[:, None] + (k0 + 32 * j + r)[None, :], mask=real[:, None], other=0)
            acc0 += _dot(a, _plane(q0, ss0[j], j, True, True))
            if TWO:
                acc1 += _dot(a, _plane(q1, ss1[j], j, True, True))
        elif j % 4 == 2:
            a = tl.load(a_row[:, None] + (k0 + 32 * j + r)[None, :], mask=real[:, None], other=0)
            a1 = tl.load(a_row[:, None] + (k0 + 32 * j + 32 + r)[None, :], mask=real[:, None], other=0)
            p, p1 = _plane2(q0, ss0[j], ss0[j + 1], j)
            acc0 += _dot(a, p)
            acc0 += _dot(a1, p1)
            if TWO:
                p, p1 = _plane2(q1, ss1[j], ss1[j + 1], j)
                acc1 += _dot(a, p)
                acc1 += _dot(a1, p1)
    return acc0, acc1

'''


BASE_FILE = os.path.join(os.path.dirname(triton_impl.__file__), "_triton_kernels.py")


def variant_source(pair: bool) -> str:
    """_triton_kernels.py's source with _plane / _k_block replaced."""
    src = open(BASE_FILE).read()
    start = src.index("@triton.jit\ndef _plane(")
    end = src.index("@triton.jit\ndef _dot(")
    src = src[:start] + src[end:]
    start = src.index("@triton.jit\ndef _k_block(")
    end = src.index("@triton.jit\ndef _project(")
    consts = (f"PF16 = {tuple(pf_source(j, True) for j in range(8))!r}\n"
              f"PBF16 = {tuple(pf_source(j, False) for j in range(8))!r}\n"
              f"PF16_2 = {(pf2_source(2, True), pf2_source(6, True))!r}\n"
              f"PBF16_2 = {(pf2_source(2, False), pf2_source(6, False))!r}\n"
              f"PAIR = {pair}\n")
    return src[:start] + consts + NEW_FUNCS + src[end:]


def variant_module(pair: bool):
    """variant_source(pair) written to a file Triton can read, imported."""
    src = variant_source(pair)
    d = tempfile.mkdtemp()
    path = os.path.join(d, f"prmt_free_{int(pair)}.py")
    open(path, "w").write(src)
    spec = importlib.util.spec_from_file_location(f"prmt_free_{int(pair)}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def to_prmt_free(q):
    """Kernel-layout words [E, Kp/8, N] -> the PRMT-free layout (row pairs repacked)."""
    u = jax.lax.bitcast_convert_type(q, jnp.uint32)
    a, b = u[:, 0::2], u[:, 1::2]
    lo = (a & jnp.uint32(0xFFFF)) | (b << jnp.uint32(16))
    hi = (a >> jnp.uint32(16)) | (b & jnp.uint32(0xFFFF0000))
    out = jnp.stack([lo, hi], axis=2).reshape(u.shape)
    return jax.lax.bitcast_convert_type(out, jnp.int32)


def moe_fn(mod):
    import jax_triton as jt

    def call(launch, out=None):
        args = launch.args
        into = args[0] if out is None else out
        aliases = {} if out is None else {len(args): 0}
        return jt.triton_call(*args, into, kernel=getattr(mod, launch.kernel), out_shape=launch.out_shape,
                              grid=launch.grid, input_output_aliases=aliases, num_warps=launch.num_warps,
                              num_stages=launch.num_stages, **launch.constants)

    def gate_up(x, row_slot, block_expert, experts, dm, cfg, top_k, out=None, row_scale=None):
        return call(triton_impl.gate_up_launch(x, row_slot, block_expert, experts, dm, cfg, top_k, row_scale), out)

    def down(h, row_slot, slot_weight, block_expert, experts, dm, cfg, out=None):
        return call(triton_impl.down_launch(h, row_slot, slot_weight, block_expert, experts, dm, cfg), out)

    @functools.partial(jax.jit, static_argnames=("cfg",))
    def f(x, ids, w, ex, cfg):
        return slot_experts(x, ids, w, ex, expert_dims(ex), cfg, gate_up, down)
    return f


E, D, I, K = 384, 7168, 2048, 8


def random_experts(scale_dtype) -> dict:
    """INT4 experts at the K2 layer shape: random words (every layout's nibbles uniform), scales
    ~ absmax / 7.5 of N(0, 0.02) weights, as kernel_bench.py makes them."""
    keys = jax.random.split(jax.random.key(1), 8)
    ex = {}
    for j, (name, kk, n) in enumerate((("gate", int4.padded_k(D), I), ("up", int4.padded_k(D), I),
                                       ("down", int4.padded_k(I), D))):
        ex[f"{name}_qweight"] = jax.lax.bitcast_convert_type(
            jax.random.bits(keys[2 * j], (E, kk // 8, n), jnp.uint32), jnp.int32)
        ex[f"{name}_qscale"] = jax.random.uniform(keys[2 * j + 1], (E, kk // 32, n), minval=0.004,
                                                  maxval=0.01).astype(jnp.bfloat16).astype(scale_dtype)
    return ex


def token_inputs(t: int):
    """Four (x, ids, w) inputs of T tokens and the bytes a call must move."""
    keys = jax.random.split(jax.random.key(1), 8)
    ids_all, w_all, _ = _routings(jax.random.fold_in(keys[7], t), t, E, K, 4)
    xs = [jax.random.normal(jax.random.fold_in(keys[6], 100 * t + r), (t, D), jnp.bfloat16) for r in range(4)]
    inputs = [(xs[r], ids_all[r], w_all[r]) for r in range(4)]
    active = float(np.mean([np.unique(np.asarray(a)).size for a in ids_all]))
    return inputs, active * 3 * D * I * (0.5 + 2 / 32) + 2 * t * D * 2


def time_rounds(t: int, calls: dict, inputs, nbytes: float, bw: float, rows: list) -> None:
    """FLAGS.pf_rounds interleaved rounds over calls {name: f(x, ids, w)}: wall time and traced
    device time per call; rows (appended) and FLAGS.pf_out get one JSON line each."""
    for rnd in range(FLAGS.pf_rounds):
        for name, call in calls.items():
            it = iter(range(1 << 30))
            sec = _time(lambda: call(*inputs[next(it) % 4]), FLAGS.min_time_s)
            tr = bench_util.traced_device_time(call, *inputs[0])
            top = {kk["name"]: kk["us"] for kk in tr["top"]}
            row = dict(T=t, variant=name, round=rnd, wall_us=sec * 1e6, device_us=tr["busy_us"],
                       gate_up_us=top.get("gate_up"), down_us=top.get("down"),
                       pct_copy_device=100 * nbytes / (tr["busy_us"] * 1e-6) / bw, scale_dtype=FLAGS.scale_dtype)
            rows.append(row)
            print(json.dumps(row), flush=True)
            if FLAGS.pf_out:
                with open(FLAGS.pf_out, "a") as fh:
                    fh.write(json.dumps(row) + "\n")


def print_table(rows: list, names, copy_tbps: float) -> None:
    print(f"\nscale {FLAGS.scale_dtype}; copy {copy_tbps:.3f} TB/s; medians over {FLAGS.pf_rounds} rounds")
    print("| T | variant | device us | % copy | gate_up us | down us | wall us |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for t in map(int, FLAGS.tokens):
        for name in names:
            sel = [r for r in rows if r["T"] == t and r["variant"] == name]
            if not sel:
                continue
            med = lambda key: float(np.median([r[key] for r in sel]))  # noqa: E731
            print(f"| {t} | {name} | {med('device_us'):.1f} | {med('pct_copy_device'):.1f} | {med('gate_up_us'):.1f} | "
                  f"{med('down_us'):.1f} | {med('wall_us'):.1f} |")


def setup_gpu() -> dict:
    """Imports jax_triton (which blanks TRITON_CACHE_DIR: restored for do_bench) and measures the
    ceilings."""
    saved = os.environ.get("TRITON_CACHE_DIR", "/tmp/th/cache")
    import jax_triton  # noqa: F401,F811
    os.environ["TRITON_CACHE_DIR"] = saved
    ceil = bench_util.measure_ceilings()
    print("ceilings", ceil, flush=True)
    return ceil


def main(_):
    ceil = setup_gpu()
    from pallas_kernels.moe import _triton_kernels as base_mod
    ex = random_experts(jnp.dtype(FLAGS.scale_dtype))
    ex_pf = {kk: (to_prmt_free(v) if kk.endswith("qweight") else v) for kk, v in ex.items()}
    fns = {"base": (moe_fn(base_mod), ex), "pf": (moe_fn(variant_module(False)), ex_pf),
           "pf2": (moe_fn(variant_module(True)), ex_pf)}
    fns = {v: fns[v] for v in FLAGS.pf_variants}
    rows = []
    for t in map(int, FLAGS.tokens):
        cfg = tuning.config(t)
        inputs, nbytes = token_inputs(t)
        ref = np.asarray(moe_experts_xla(*inputs[0], ex).astype(jnp.float32), np.float64)
        base_out = None
        for name, (fn, exv) in fns.items():
            out = np.asarray(fn(*inputs[0], exv, cfg=cfg).astype(jnp.float32), np.float64)
            err = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
            same = None if base_out is None else bool(np.array_equal(out, base_out))
            if name == "base":
                base_out = out
            print(f"check T={t} {name}: rel err vs xla {err:.3e}, bitwise equal to base: {same}", flush=True)
            if not err < 2e-2 or same is False:
                raise SystemExit(f"{name} at T={t} is wrong")
        calls = {name: functools.partial(lambda x, a, b, fn, exv: fn(x, a, b, exv, cfg=cfg), fn=fn, exv=exv)
                 for name, (fn, exv) in fns.items()}
        time_rounds(t, calls, inputs, nbytes, ceil["copy_tbps"] * 1e12, rows)
    print_table(rows, fns, ceil["copy_tbps"])


if __name__ == "__main__":
    app.run(main)
