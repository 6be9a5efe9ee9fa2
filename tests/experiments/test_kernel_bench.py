"""experiments/kernel_bench.py's --variants parsing (the benchmark itself needs a GPU and torch), and
experiments/mla_bench.py's sweep in interpret mode.

Run in a subprocess: the module defines absl flags at import, which must not meet other modules'."""

import os
import subprocess
import sys

import numpy as np
import pytest

from tests import ROOT

# XLA's CPU backend without LLVM's costly optimisations: compiles faster, runs slower (for a test
# whose time is compilation; tests/framework/test_sharding.py runs its checks so too).
FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


def _run(argv, xla_flags: str = "") -> subprocess.CompletedProcess:
    """`python argv...` from the repository root with it on PYTHONPATH (XLA_FLAGS extended)."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if xla_flags:
        env["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + xla_flags).strip()
    return subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def _check(code: str, xla_flags: str = "") -> subprocess.CompletedProcess:
    """Run a check script (`python -c code`); it must exit 0 and print 'ok' last."""
    out = _run(["-c", code], xla_flags)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]
    return out

CHECK = """
from experiments.kernel_bench import parse_variants, _variant_cfgs
from pallas_kernels.moe import tuning
sets = parse_variants('bn_down=256, down_warps=8 ; scale_weights=false;dequant=bits;')
assert sets == [dict(bn_down=256, down_warps=8), dict(scale_weights=False), dict(dequant='bits')], sets
cfgs = _variant_cfgs(64, sets)
base = tuning.config(64)
assert cfgs[0] == base._replace(bn_down=256, down_warps=8) and cfgs[0].bn_up == base.bn_up
assert cfgs[1].scale_weights is False and cfgs[2].dequant == 'bits'
for t in (1, 4, 64, 1024):   # the built-in sets when none are given: one knob of the tuned entry moved
    builtin = _variant_cfgs(t)
    assert len(builtin) >= 5 and len(set(builtin)) == len(builtin) and tuning.config(t) not in builtin, builtin
    assert all(sum(a != b for a, b in zip(c, tuning.config(t))) == 1 for c in builtin), builtin
    assert any(c.split_k == 4 for c in builtin) == (t <= 4), builtin
raw = _variant_cfgs(4096, parse_variants('bn_up=64;num_warps=8'), raw=True)   # the raw Triton kernels
assert raw == [tuning.config(4096)._replace(bn_up=64), tuning.config(4096)._replace(num_warps=8)], raw
assert all(c != tuning.config(4096) for c in raw), raw
assert _variant_cfgs(4096, [dict(bm=64, dequant='bits')])[0].bm == 64
for t in (1, 64):   # the raw kernels' neighbours leave the fields those kernels ignore alone
    builtin = _variant_cfgs(t, raw=True)
    assert builtin and all(c.swap_ab == tuning.config(t).swap_ab and c.split_k == 1 for c in builtin), builtin
    assert set(builtin) < set(_variant_cfgs(t)), builtin
for sets, word in (([dict(bn_up=128), dict(swap_ab=True, split_k=2)], 'split_k, swap_ab'),
                   ([dict(bm=64, num_warps=8)], "dequant='asm'")):   # refused before any device work
    try:
        _variant_cfgs(64, sets, raw=True)
    except ValueError as e:
        assert word in str(e), (sets, e)
    else:
        raise AssertionError(sets)
for bad, word in (('bn_dwn=4', 'bn_dwn'), ('bn_down', 'bn_down'), ('bn_down=x', 'bn_down'),
                  ('swap_ab=maybe', 'swap_ab')):
    try:
        parse_variants(bad)
    except ValueError as e:
        assert word in str(e), (bad, e)
    else:
        raise AssertionError(bad)
print('ok')
"""


def test_parse_variants():
    _check(CHECK)



ALL_TOKENS_CHECK = """
import jax, jax.numpy as jnp, numpy as np
from experiments.kernel_bench import all_tokens_error
from pallas_kernels import moe
from pallas_kernels.moe import tuning
from pallas_kernels.moe.pallas_triton import moe_experts_pallas
rng = np.random.default_rng(SEED)
e, d, i, t, k = 6, 96, 64, 40, 2
hf = [moe.quantize_int4(rng.standard_normal(s).astype(np.float32) * 0.5) for s in ((e, i, d), (e, i, d), (e, d, i))]
ex = moe.prepare_experts_int4(*hf[0], *hf[1], *hf[2])
ids = jnp.asarray(np.stack([rng.choice(e, k, replace=False) for _ in range(t)]).astype(np.int32))
w = jnp.asarray(rng.random((t, k)).astype(np.float32))
x = jnp.asarray(rng.standard_normal((t, d)), jnp.bfloat16)
good = moe_experts_pallas(x, ids, w, ex, cfg=tuning.MoEConfig(bm=32, bn_up=32, bn_down=32, scale_weights=True, min_bm=16))
assert all_tokens_error(good, x, ids, w, ex) < 8e-3        # another form of the same op: bf16 rounding only
bad = good.at[5:9].set(good[20:24])                        # 4 tokens take others' rows: a block-local fault
err = all_tokens_error(bad, x, ids, w, ex)
assert 0.2 < err < 2, err
assert all_tokens_error(good.at[3, 0].set(jnp.nan), x, ids, w, ex) == float('inf')
print('ok')
"""


def test_all_tokens_error_catches_block_local_faults():
    """kernel_bench's whole-output check of untried variants (the golden check covers 2 tokens):
    another kernel form of the op agrees within bf16 rounding, 4 of 40 tokens taking other
    tokens' rows is caught, a NaN gives inf. Interpret mode, fresh seed."""
    seed = int(np.random.SeedSequence().generate_state(1)[0])
    _check(ALL_TOKENS_CHECK.replace("SEED", str(seed)), FAST_COMPILE)

@pytest.mark.parametrize("argv, words", [
    (["--impls=triton,trition"], "--impls takes names from"),
    (["--impls=triton_variants", "--variants=swap_ab=true"], "the raw Triton kernels ignore swap_ab"),
    (["--impls=variants", "--variants=bn_up=128;bm=64"], "MoEConfig.dequant='asm' needs bm <= 32"),
])
def test_kernel_bench_refuses_bad_impls_before_device_work(argv, words, tmp_path):
    """An unknown implementation (never run as another path), raw-kernel variants that
    would time the tuned kernels under another name (a field those kernels ignore), or a set no kernel runs correctly (PTX
    dequantisation in 64-row blocks): refused by name, before any device work."""
    out = _run([os.path.join(ROOT, "experiments", "kernel_bench.py"), f"--out_dir={tmp_path / 'kb'}", *argv])
    assert out.returncode != 0 and words in out.stderr, out.stderr[-2000:]
    assert not (tmp_path / "kb").exists()


@pytest.mark.parametrize("script", ["kernel_bench.py", "mla_bench.py"])
def test_load_s_below_the_sustained_window_is_refused(script):
    """--load_s of 1 s or less would leave the sustained window empty: refused at flag parsing,
    naming the flag, before any device work."""
    out = _run([os.path.join(ROOT, "experiments", script), "--load_s=0.5"])
    assert out.returncode != 0 and "--load_s must be 0 (off) or more than 1" in out.stderr, out.stderr[-2000:]


MLA_REGIMES_CHECK = """
from experiments.mla_bench import regime_floors, regimes_table
ceil = dict(copy_tbps=4.0, matmul_tflops_xla=700.0, matmul_tflops_torch=650.0)
load = dict(burst_us=100.0, first_us=80.0, sustained_us=125.0, burst_clocks=dict(sm_mhz=1980.0), sustained_clocks={})
# 70 GFLOP, 100 MB: compute-bound at 700 TFLOP/s (100 us), copy 25 us
got = regime_floors(load, 70e9, 100e6, ceil)
assert abs(got['burst_floor_ms'] - 0.1) < 1e-12 and abs(got['burst_pct_floor'] - 100.0) < 1e-9, got
assert abs(got['sustained_pct_floor'] - 80.0) < 1e-9 and abs(got['first_pct_floor'] - 125.0) < 1e-9, got
# with the load ceilings: the sustained matmul 560 TFLOP/s sets a 125 us floor, the first 25 ms' 875 an
# 80 us one, the burst copy a 100 MB / 1 TB/s one
ceil.update(matmul_load=dict(burst_tflops=700.0, first_tflops=875.0, sustained_tflops=560.0),
            copy_load=dict(burst_tbps=1.0))
got = regime_floors(load, 70e9, 100e6, ceil)
assert abs(got['sustained_pct_floor'] - 100.0) < 1e-9 and abs(got['burst_floor_ms'] - 0.1) < 1e-12, got
assert abs(got['first_floor_ms'] - 0.08) < 1e-12 and abs(got['first_pct_floor'] - 100.0) < 1e-9, got
assert regime_floors(dict(burst_us=None, sustained_us=None), 1.0, 1.0, ceil).keys() == {
    'burst_floor_ms', 'first_floor_ms', 'sustained_floor_ms'}
row = dict(ctx=8192, q=16, s=8, impl='mosaic_gpu', load=load, **got)
xla = dict(ctx=8192, q=16, s=8, impl='xla', load=dict(burst_us=210.0, first_us=200.0, sustained_us=250.0))
other = dict(ctx=8192, q=64, s=8, impl='mosaic_gpu', ms=1.0)          # no load profile: no line
lines = regimes_table([xla, row, other], ceil).splitlines()
assert lines[0].startswith('ceilings under the same load: copy 1 / - / - TB/s, bf16 matmul (torch) 700 / 875 / 560'), lines[0]
assert len(lines) == 6 and len({ln.count('|') for ln in lines[2:]}) == 1, lines
assert 'first 25 ms ms (% floor)' in lines[2], lines[2]
assert lines[4] == ('| 8192 | 16 | 8 | mosaic_gpu | 0.100 (100.0, 1980) | 0.080 (100.0) | 0.125 (100.0, -) '
                    '| 2.10x / 2.50x / 2.00x |'), lines[4]
assert lines[5].startswith('| 8192 | 16 | 8 | xla | 0.210 (nan, -) | 0.200 (nan) |') and lines[5].endswith('| - |'), lines[5]
assert regimes_table([row]).splitlines()[0].startswith('| ctx |')    # no load ceilings: no header line
print('ok')
"""


def test_mla_bench_regimes_table():
    """mla_bench --load_s's per-regime floors (from the load ceilings where measured) and table."""
    _check(MLA_REGIMES_CHECK)


SPLIT_CHECK = """
from experiments.kernel_bench import kernel_split, _regimes_table, _table
top = [{'name': 'gate_up', 'us': 500.0}, {'name': 'down', 'us': 250.0}, {'name': 'loop_reduce_fusion', 'us': 3.0}]
got = kernel_split(top, 760.0, {'gate_up': 1.6e9, 'down': 0.8e9}, 4.0e12)
want = dict(gate_up_us=500.0, down_us=250.0, glue_us=10.0, gate_up_pct_copy=80.0, down_pct_copy=80.0)
assert set(got) == set(want) and all(abs(got[k] - v) < 1e-9 for k, v in want.items()), got
pallas = [{'name': '_down_kernel', 'us': 2.0}, {'name': '_gate_up_kernel', 'us': 4.0}]
assert kernel_split(pallas, 7.0, {'gate_up': 8e6, 'down': 4e6}, 4e12)['glue_us'] == 1.0
assert kernel_split([{'name': 'dot_fusion', 'us': 9.0}], 9.0, {'gate_up': 1, 'down': 1}, 1.0) == {}   # xla path
row = dict(impl='triton', T=16, active_experts=111.0, bytes=2.75e9, time_us=800.0, GBps=3437.0, pct_copy=80.6,
           pct_floor=80.6, rel_err=1.7e-3, device_us=760.0, span_us=771.5, pct_copy_device=84.9, kernels=16,
           wall_clocks=dict(sm_mhz=1620.0), trace_clocks=dict(sm_mhz=1980.0), **got)
xla = dict(impl='xla', T=16, active_experts=111.0, bytes=2.75e9, time_us=9e3, GBps=305.0, pct_copy=7.2,
           pct_floor=7.2, rel_err=1e-3)
failed = dict(impl='ragged_dot', T=256, active_experts=381.8, error='XlaRuntimeError: RESOURCE_EXHAUSTED')
lines = _table({'rows': [row, xla, failed]}).splitlines()
assert len({ln.count('|') for ln in lines}) == 1, lines          # every row has every column
assert '| 760.0 | 771.5 | 84.9 | 500.0 (80.0) | 250.0 (80.0) | 10.0 | 16 | 1620 / 1980 |' in lines[2], lines[2]
assert '| nan | nan | nan |  |  |  | nan |  |' in lines[3], lines[3]     # no GEMM kernels: no glue either
assert 'RESOURCE_EXHAUSTED' in lines[4], lines[4]
row.update(floor_s=645e-6, burst_pct_copy=88.7, first_pct_copy=91.8, sustained_pct_copy=79.4,
           load=dict(burst_us=726.7, first_us=702.0, sustained_us=812.1, burst_clocks=dict(sm_mhz=1980.0),
                     sustained_clocks={}))
regimes = _regimes_table({'rows': [row, xla]}).splitlines()
assert len(regimes) == 3 and len({ln.count('|') for ln in regimes}) == 1, regimes     # rows with a profile only
assert regimes[2] == '| 16 | triton | 111.0 | 2750 | 645 | 726.7 (88.7, 1980) | 702.0 (91.8) | 812.1 (79.4, -) | - / - |', regimes[2]
ceil = dict(copy_tbps=4.264, copy_load=dict(burst_tbps=4.25, sustained_tbps=4.2, burst_clocks=dict(sm_mhz=1980.0)))
with_copy = _regimes_table({'rows': [row], 'ceilings': ceil}).splitlines()
assert with_copy[0] == ('copy under the same load: burst 4.250 TB/s (SM 1980 MHz), sustained 4.200 TB/s '
                        '(SM - MHz); % copy below is of 4.264 TB/s (measure_ceilings)'), with_copy[0]
assert with_copy[2:] == regimes, with_copy
row.update(burst_pct_copy_load=89.0, sustained_pct_copy_load=80.6)
assert _regimes_table({'rows': [row]}).splitlines()[2].endswith('| 812.1 (79.4, -) | 89.0 / 80.6 |')
from experiments.kernel_bench import XLA_NO_LOAD
xla.update(floor_s=645e-6, load_skipped=XLA_NO_LOAD)             # a row without a profile says why
both = _regimes_table({'rows': [row, xla]}).splitlines()
assert len(both) == 4 and len({ln.count('|') for ln in both}) == 1, both
assert both[3] == f'| 16 | xla | 111.0 | 2750 | 645 | - | - | - | {XLA_NO_LOAD} |', both[3]
ceil['copy_load'].update(sustained_tbps=None)                   # no copy in a regime: '-', not a crash
assert 'sustained - TB/s' in _regimes_table({'rows': [row], 'ceilings': ceil}).splitlines()[0]
print('ok')
"""


BUDGET_CHECK = """
from experiments.kernel_bench import skipped_row, trace_calls, _table
assert [trace_calls(s) for s in (1e-4, 0.0125, 0.04, 0.08, 2.0)] == [16, 16, 5, 2, 2]   # 0.2 s of calls, 2-16
assert skipped_row('xla', 256, 400.0, 0) is None              # no budget
assert skipped_row('xla', 256, 299.0, 300.0) is None          # within it
row = skipped_row('bf16_weights', 4096, 301.4, 300.0)
assert row == dict(impl='bf16_weights', T=4096, error='skipped: past --budget_s=300 (301 s in)'), row
lines = _table({'rows': [row]}).splitlines()
assert len({ln.count('|') for ln in lines}) == 1, lines      # a skipped row has every column
assert lines[2].startswith('| 4096 | bf16_weights |  |') and 'skipped: past --budget_s=300' in lines[2], lines[2]
print('ok')
"""


def test_budget_skips_rows_and_keeps_the_table():
    """--budget_s: past it, an implementation and T become a row that says it was skipped, which
    the table prints with every column (so a run cut short still writes its tables); --trace
    profiles fewer calls of the slow baselines (trace_calls)."""
    _check(BUDGET_CHECK)


def test_kernel_split_and_table():
    """kernel_bench's device-time split (GEMM kernels by their own bytes, the rest as glue) and its
    table: every row has every column, an implementation without those kernels leaves them empty."""
    _check(SPLIT_CHECK)


MLA_CHECK = """
from experiments import mla_bench
from pallas_kernels.mla_attention import two_pass
tp = two_pass.TwoPassConfig(32, 32, 4, 2, 16, 16, 16, 4, 2)
seen = []
rows = mla_bench.run_mla_bench([70], [5], [2], heads=2, dk=48, v_dim=32, configs={'auto': None, tp.name: tp},
                               ceilings={'copy_tbps': 1.0, 'matmul_tflops_xla': 1.0, 'matmul_tflops_torch': 1.0},
                               parts=True, impls=('pallas_triton', 'xla', 'auto'), in_graph=True,
                               trace=True, lengths=('uniform', 'spread'), max_sets=2, log=lambda _: None,
                               on_row=lambda so_far: seen.append(len(so_far)))
assert seen == list(range(1, 9)), seen                # called after every row, with the rows so far
assert mla_bench.stream_contexts(70, 2, 'spread') == [35, 105]
assert {r['lengths'] for r in rows} == {'uniform', 'spread'} and len(rows) == 8
spread = [r for r in rows if r['lengths'] == 'spread']
assert all(r['flops'] == s['flops'] and r['bytes'] == s['bytes'] for r, s in zip(rows[:4], spread))  # same total
for r in spread:                                     # the ragged case checked against the golden too
    assert 'error' not in r and r['ms'] > 0 and (r['impl'] == 'xla' or r['rel_err_golden'] < 1e-2), r
assert '| 70 spread | 5 | 2 |' in mla_bench.table(rows)
rows = [r for r in rows if r['lengths'] == 'uniform']
by = {r['impl']: r for r in rows}
assert set(by) == {'xla', 'pallas auto', 'pallas ' + tp.name, 'auto'}, set(by)
for r in rows:
    assert 'error' not in r and r['ms'] > 0 and r['graph_ms'] > 0, r
    assert 'device_ms' not in r, r                   # the CPU's trace holds no device kernels
for name in ('pallas auto', 'pallas ' + tp.name, 'auto'):    # 'auto': impl="auto", here the xla path
    assert by[name]['rel_err_golden'] < 1e-2 and by[name]['rel_err_vs_xla'] < 1e-2, by[name]
assert by['pallas ' + tp.name]['scores_ms'] > 0 and by['pallas ' + tp.name]['pv_ms'] > 0
assert 'scores_ms' not in by['pallas auto']          # small shapes: the one-pass kernel, no parts
assert '| 70 | 5 | 2 |' in mla_bench.table(rows)
print('ok')
"""


def test_mla_bench_runs_on_the_cpu():
    """experiments/mla_bench.py's sweep (interpret mode, given ceilings): golden-checked rows for the
    auto and a two-pass config, each pass of the two-pass one timed alone, and impl="auto"; two
    input sets per shape (max_sets), so each in-graph program holds two interpreted calls."""
    _check(MLA_CHECK)


# The probe's --lower_only runs over a covering set of its (shape, splits, epilogue) product; each
# flag set below is parsed as its command line would be and run through the script's main, in one
# process (the imports and the absl flags are paid for once; the same command lines lower the same).
PROBE_CASES = (("--shapes=1024:2:2", "--splits=1,3", "--epilogues=tma,registers"),   # cluster 2: all four
               ("--shapes=1024:3:1", "--splits=1", "--epilogues=tma,registers"),     # cluster 1, whole
               ("--shapes=2048:1:2", "--splits=3", "--epilogues=tma,registers"),     # cluster 1, 3 runs
               ("--shapes=1024:4:1", "--clusters=4", "--splits=1", "--epilogues=tma"))  # --clusters: 4 CTAs

PROBE_CHECK = """
import sys
from absl import flags
from experiments import mla_mosaic_probe
for args in CASES:
    flags.FLAGS.unparse_flags()
    argv = flags.FLAGS(['experiments/mla_mosaic_probe.py', '--lower_only', '--profile', '--timeline', *args])
    mla_mosaic_probe.main(argv)
    sys.stdout.flush()
"""


def test_mla_mosaic_probe_lowers():
    """experiments/mla_mosaic_probe.py --lower_only --profile --timeline: the Mosaic GPU kernel
    lowered for CUDA on the CPU, each case three times: as is, with the in-kernel profiler
    (--profile: its buffer must fit the shared memory left over) and with the timeline's
    %globaltimer stores (--timeline). The kernel's code depends on the cluster (two CTAs when Q's
    64-row blocks pair up, else one), the run count (splits 1: whole contexts; 3: each stream's
    context split into 3 runs, parts indexed by run) and the epilogue (O by TMA from Q's shared
    memory, or from registers); at these shapes (balance off, every row block whole: R a multiple
    of 64, one wave of CTAs) the shape otherwise sets only grid and operand sizes. Every one of
    those 2 x 2 x 2 kernels is lowered, 8 cases (PROBE_CASES; the full product over the 3 shapes
    is 12, 4 of them a second shape of cluster 1 for a combination already lowered):
    1024:2:2 (Q 2 x 64 heads = 2 row blocks, cluster 2, S 2) at splits 1 and 3 with both epilogues;
    1024:3:1 (3 row blocks, cluster 1, S 1) at splits 1 with both epilogues; 2048:1:2 (1 row
    block: decode, cluster 1, S 2) at splits 3 with both epilogues. A ninth, 1024:4:1 with
    --clusters=4, lowers a 4-CTA cluster, the probe's other cluster size
    (docs/kernels/mla_attention.md, "Variants measured and not taken"). (The operands are made and
    prepared on the CPU: FAST_COMPILE.)"""
    out = _check(f"CASES = {PROBE_CASES!r}\n" + PROBE_CHECK, FAST_COMPILE)
    want = {f"ctx={ctx} Q={q} S={s} splits={k} cluster={cl} epilogue={e}: lowered"
            for ctx, q, s, cl, splits in (("1024", 2, 2, 2, (1, 3)), ("1024", 3, 1, 1, (1,)), ("2048", 1, 2, 1, (3,)))
            for k in splits for e in ("tma", "registers")}
    want.add("ctx=1024 Q=4 S=1 splits=1 cluster=4 epilogue=tma: lowered")
    lines = out.stdout.splitlines()
    assert len(want) == 9 and set(ln for ln in lines if "lowered" in ln) == want, out.stdout
    assert out.stdout.count("lowered") == 9 and lines.count("ok") == len(PROBE_CASES), out.stdout


def test_mla_mosaic_probe_reads_the_ptxas_report():
    """The probe's parse of `ptxas -v` (text as ptxas 13.0 printed it for this kernel on the H200)."""
    from experiments.mla_mosaic_probe import ptxas_summary
    report = ("ptxas warning : Registers are spilled to local memory in function 'body_mosaic_gpu_kernel', "
              "1392 bytes spill stores, 1360 bytes spill loads\nptxas info    : 0 bytes gmem\n"
              "ptxas info    : Function properties for body_mosaic_gpu_kernel\n"
              "    688 bytes stack frame, 1392 bytes spill stores, 1360 bytes spill loads\n"
              "ptxas info    : Used 168 registers, used 16 barriers, 688 bytes cumulative stack size\n")
    assert ptxas_summary(report) == dict(registers=168, spill_store_bytes=1392, spill_load_bytes=1360)
    assert ptxas_summary("") == {}


def test_mla_bench_mosaic_parts_with_the_twin():
    """mla_bench.mosaic_parts on the CPU, the kernel's XLA twin in its place: 1100 + 2 keys (8
    whole pairs and a tail pair) give one stream's single row block 9 runs of one pair (launch),
    so prep, kernel and merge (the Pallas one, "rows" form, in interpret mode) are each timed; the parts, run in
    order, give the golden's output."""
    import jax
    from experiments import mla_bench
    from pallas_kernels.mla_attention import mosaic_gpu
    from pallas_kernels.mla_attention.reference import mla_attention_reference
    from tests.kernel_testing import assert_close
    args = mla_bench.make_inputs(jax.random.key(3), 1, 3, 4, 48, 1100, 1112, 2)
    twin = mosaic_gpu.context_attention_xla
    got = mla_bench.mosaic_parts(args, 0.2, 32, context=twin)
    assert got["splits"] == 9 and got["merge"] == "rows", got   # merge.form_for(9)
    assert min(got["prep_ms"], got["kernel_ms"], got["merge_ms"]) > 0, got
    prepared = mosaic_gpu.prepare(*args[0])
    o = mosaic_gpu.merge_runs(*twin(*prepared, num_q=3, scale=0.2, v_dim=32, splits=9), prepared[2],
                              args[0][0].dtype, num_q=3)
    want = mla_attention_reference(*args[0], scale=0.2, v_dim=32)
    assert_close(o[:, :12].reshape(1, 3, 4, 32), want, 6e-3, "mosaic parts in order")   # bf16, as test_mla_attention


def test_mla_bench_device_time_is_per_call(monkeypatch):
    """mla_bench.traced_in_graph: the profile covers one program of len(arg_sets) calls, so its
    device-busy time, kernel count and top kernels are divided by that count; the row's line and
    the table show them."""
    import jax.numpy as jnp
    from experiments import mla_bench
    seen = {}

    def fake_trace(fn, sets, calls):
        seen.update(sets=len(sets), calls=calls)
        return dict(busy_us=80.0, kernels=12.0, top=[dict(name="body_mosaic_gpu_kernel", count=4.0, us=60.0)],
                    host_window=(1.0, 2.0))

    monkeypatch.setattr(mla_bench.timing, "traced_device_time", fake_trace)
    got = mla_bench.traced_in_graph(lambda x: x + 1, [(jnp.ones(2),)] * 4)
    assert seen == dict(sets=4, calls=5)
    assert got == dict(busy_us=20.0, kernels=3.0, top=[dict(name="body_mosaic_gpu_kernel", count=1.0, us=15.0)],
                       host_window=(1.0, 2.0))
    row = dict(ctx=8192, q=1, s=1, impl="mosaic_gpu", flops=1e9, bytes=1e7, floor_ms=0.002, ms=0.07,
               pct_floor=2.9, tflops=14.0, device_ms=0.020, device_pct_floor=10.0, kernels=3.0,
               top_kernels=got["top"])
    assert "device 0.020 ms 10.0% (3 kernels: body_mosaic_gpu_kernel 15.0 us)" in mla_bench._fmt(row)
    assert "| 0.020 | 10.0 |" in mla_bench.table([row])
    assert mla_bench.table([row]).splitlines()[-1].endswith("| mosaic_gpu |  |")         # no clocks sampled
    row.update(wall_clocks=dict(sm_mhz=1755.0), trace_clocks={})
    assert mla_bench.table([row]).splitlines()[-1].endswith("| mosaic_gpu | 1755 / - |")


def test_mla_mosaic_probe_summarises_the_timeline():
    """timeline_summary on a context_attention timeline [S=1, B=2, K=2, point]: the low word of
    %globaltimer wraps between CTAs (the first start is 2^32 - 1000 ns); times come out in us after
    the first start; the run that ends last is run 1."""
    from experiments.mla_mosaic_probe import timeline_summary
    from pallas_kernels.mla_attention.mosaic_gpu import TIMELINE
    assert TIMELINE[-1] == "smid"
    base = 2 ** 32 - 1000
    # ns after base: start, q_ready, loops_done, sums_done, stores_issued, end, loops_done_1, last_load
    ctas = [[0, 1000, 40000, 40200, 41100, 41700, 39800, 36000],
            [100, 1100, 41000, 41200, 42100, 42700, 40800, 37000],
            [0, 900, 42000, 42300, 43200, 43800, 42100, 38000],
            [200, 1200, 44000, 44200, 45100, 45800, 44300, 40000]]
    raw = np.array([[(base + np.array(c)) % 2 ** 32 for c in ctas]], np.int64)    # [1, 4, 8]
    raw = np.concatenate([raw, np.arange(4)[None, :, None] + 7], axis=2)          # smid 7..10
    times = (raw - (raw >= 2 ** 31) * 2 ** 32).astype(np.int32).reshape(1, 2, 2, len(TIMELINE))
    got = timeline_summary(times, device_us=48.0)
    assert got["ctas"] == 4 and got["sms"] == 4
    assert got["points"]["start"] == dict(min=0.0, median=0.05, max=0.2)
    assert got["points"]["end"]["max"] == 45.8 and got["outside_ctas_us"] == pytest.approx(2.2)
    assert got["phases"]["wait_q"] == dict(min=0.9, median=1.0, max=1.0)
    assert got["phases"]["store_wait"]["median"] == pytest.approx(0.6)
    assert got["phases"]["consumer_skew"]["min"] == pytest.approx(-0.2)
    assert got["end_by_run"] == [42.75, 44.25]       # CTAs (run 0: 41.7, 43.8), (run 1: 42.7, 45.8)
    assert np.array(got["raw_us"]).shape == (4, 8) and got["smid"] == [7, 8, 9, 10]


def test_mla_mosaic_probe_reads_the_profiler_trace():
    """profile_phases on a Mosaic GPU profiler trace (B/E events, tid = 1 + warpgroup + 3 CTA): two
    CTAs; consumer 0's "context" entered twice in CTA 1 (summed); CTA 1 starts 2 us late."""
    from experiments.mla_mosaic_probe import profile_phases
    ev = lambda name, ph, ts, tid: dict(name=name, ph=ph, ts=ts, pid=1, tid=tid)  # noqa: E731
    trace = dict(traceEvents=[
        ev("wait_q", "B", 10.0, 1), ev("wait_q", "E", 11.0, 1),
        ev("context", "B", 11.0, 1), ev("context", "E", 15.0, 1),
        ev("loads", "B", 10.0, 3), ev("loads", "E", 14.0, 3),
        ev("context", "B", 12.0, 4), ev("context", "E", 14.0, 4),
        ev("context", "B", 15.0, 4), ev("context", "E", 18.0, 4),
        ev("epilogue", "B", 18.0, 5), ev("epilogue", "E", 20.0, 5)])
    got = profile_phases(trace)
    assert got["span_us"] == 10.0 and got["ctas"] == 2
    assert got["start_us"] == dict(median=1.0, max=2.0) and got["end_us"] == dict(median=7.5, max=10.0)
    assert got["phases"] == {"consumer0/context": dict(median=4.5, max=5.0),
                             "consumer0/wait_q": dict(median=1.0, max=1.0),
                             "consumer1/epilogue": dict(median=2.0, max=2.0),
                             "producer/loads": dict(median=4.0, max=4.0)}
    assert profile_phases(dict(traceEvents=[])) == {}
