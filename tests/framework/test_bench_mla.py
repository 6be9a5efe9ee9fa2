"""ddtree_jax/bench/mla.py (experiments/mla_bench.py's support): the sweep in interpret mode, the
per-regime floors and tables, mosaic_gpu's parts with the kernel's XLA twin, device time per call."""

import jax
import jax.numpy as jnp

from ddtree_jax.bench import mla, timing
from pallas_kernels.mla_attention import mosaic_gpu, two_pass
from pallas_kernels.mla_attention.reference import mla_attention_reference
from tests.kernel_testing import assert_close


def test_mla_bench_regimes_table():
    """mla_bench --load_s's per-regime floors (from the load ceilings where measured) and table."""
    ceil = dict(copy_tbps=4.0, matmul_tflops_xla=700.0, matmul_tflops_torch=650.0)
    load = dict(burst_us=100.0, first_us=80.0, sustained_us=125.0, burst_clocks=dict(sm_mhz=1980.0),
                sustained_clocks={})
    # 70 GFLOP, 100 MB: compute-bound at 700 TFLOP/s (100 us), copy 25 us
    got = mla.regime_floors(load, 70e9, 100e6, ceil)
    assert abs(got['burst_floor_ms'] - 0.1) < 1e-12 and abs(got['burst_pct_floor'] - 100.0) < 1e-9, got
    assert abs(got['sustained_pct_floor'] - 80.0) < 1e-9 and abs(got['first_pct_floor'] - 125.0) < 1e-9, got
    # with the load ceilings: the sustained matmul 560 TFLOP/s sets a 125 us floor, the first 25 ms' 875 an
    # 80 us one, the burst copy a 100 MB / 1 TB/s one
    ceil.update(matmul_load=dict(burst_tflops=700.0, first_tflops=875.0, sustained_tflops=560.0),
                copy_load=dict(burst_tbps=1.0))
    got = mla.regime_floors(load, 70e9, 100e6, ceil)
    assert abs(got['sustained_pct_floor'] - 100.0) < 1e-9 and abs(got['burst_floor_ms'] - 0.1) < 1e-12, got
    assert abs(got['first_floor_ms'] - 0.08) < 1e-12 and abs(got['first_pct_floor'] - 100.0) < 1e-9, got
    assert mla.regime_floors(dict(burst_us=None, sustained_us=None), 1.0, 1.0, ceil).keys() == {
        'burst_floor_ms', 'first_floor_ms', 'sustained_floor_ms'}
    row = dict(ctx=8192, q=16, s=8, impl='mosaic_gpu', load=load, **got)
    xla = dict(ctx=8192, q=16, s=8, impl='xla', load=dict(burst_us=210.0, first_us=200.0, sustained_us=250.0))
    other = dict(ctx=8192, q=64, s=8, impl='mosaic_gpu', ms=1.0)          # no load profile: no line
    lines = mla.regimes_table([xla, row, other], ceil).splitlines()
    assert lines[0].startswith('ceilings under the same load: copy 1 / - / - TB/s, bf16 matmul (torch) '
                               '700 / 875 / 560'), lines[0]
    assert len(lines) == 6 and len({ln.count('|') for ln in lines[2:]}) == 1, lines
    assert 'first 25 ms ms (% floor)' in lines[2], lines[2]
    assert lines[4] == ('| 8192 | 16 | 8 | mosaic_gpu | 0.100 (100.0, 1980) | 0.080 (100.0) | 0.125 (100.0, -) '
                        '| 2.10x / 2.50x / 2.00x |'), lines[4]
    assert lines[5].startswith('| 8192 | 16 | 8 | xla | 0.210 (nan, -) | 0.200 (nan) |') and \
        lines[5].endswith('| - |'), lines[5]
    assert mla.regimes_table([row]).splitlines()[0].startswith('| ctx |')    # no load ceilings: no header line


def test_mla_bench_runs_on_the_cpu():
    """mla.run_mla_bench (interpret mode, given ceilings): golden-checked rows for the auto and a
    two-pass config, each pass of the two-pass one timed alone, and impl="auto"; two input sets per
    shape (max_sets), so each in-graph program holds two interpreted calls."""
    tp = two_pass.TwoPassConfig(32, 32, 4, 2, 16, 16, 16, 4, 2)
    seen = []
    rows = mla.run_mla_bench([70], [5], [2], heads=2, dk=48, v_dim=32, configs={'auto': None, tp.name: tp},
                             ceilings={'copy_tbps': 1.0, 'matmul_tflops_xla': 1.0, 'matmul_tflops_torch': 1.0},
                             parts=True, impls=('pallas_triton', 'xla', 'auto'), in_graph=True,
                             trace=True, lengths=('uniform', 'spread'), max_sets=2, log=lambda _: None,
                             on_row=lambda so_far: seen.append(len(so_far)))
    assert seen == list(range(1, 9)), seen                # called after every row, with the rows so far
    assert timing.stream_contexts(70, 2, 'spread') == [35, 105]
    assert {r['lengths'] for r in rows} == {'uniform', 'spread'} and len(rows) == 8
    spread = [r for r in rows if r['lengths'] == 'spread']
    assert all(r['flops'] == s['flops'] and r['bytes'] == s['bytes'] for r, s in zip(rows[:4], spread))  # same total
    for r in spread:                                     # the ragged case checked against the golden too
        assert 'error' not in r and r['ms'] > 0 and (r['impl'] == 'xla' or r['rel_err_golden'] < 1e-2), r
    assert '| 70 spread | 5 | 2 |' in mla.table(rows)
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
    assert '| 70 | 5 | 2 |' in mla.table(rows)


def test_mla_bench_mosaic_parts_with_the_twin():
    """mla.mosaic_parts on the CPU, the kernel's XLA twin in its place: 1100 + 2 keys (8
    whole pairs and a tail pair) give one stream's single row block 9 runs of one pair (launch),
    so prep, kernel and merge (the Pallas one, "rows" form, in interpret mode) are each timed; the parts, run in
    order, give the golden's output."""
    args = mla.make_inputs(jax.random.key(3), 1, 3, 4, 48, 1100, 1112, 2)
    twin = mosaic_gpu.context_attention_xla
    got = mla.mosaic_parts(args, 0.2, 32, context=twin)
    assert got["splits"] == 9 and got["merge"] == "rows", got   # merge.form_for(9)
    assert min(got["prep_ms"], got["kernel_ms"], got["merge_ms"]) > 0, got
    prepared = mosaic_gpu.prepare(*args[0])
    o = mosaic_gpu.merge_runs(*twin(*prepared, num_q=3, scale=0.2, v_dim=32, splits=9), prepared[2],
                              args[0][0].dtype, num_q=3)
    want = mla_attention_reference(*args[0], scale=0.2, v_dim=32)
    assert_close(o[:, :12].reshape(1, 3, 4, 32), want, 6e-3, "mosaic parts in order")   # bf16, as test_mla_attention


def test_mla_bench_device_time_is_per_call(monkeypatch):
    """mla.traced_in_graph: the profile covers one program of len(arg_sets) calls, so its
    device-busy time, kernel count and top kernels are divided by that count; the row's line and
    the table show them."""
    seen = {}

    def fake_trace(fn, sets, calls):
        seen.update(sets=len(sets), calls=calls)
        return dict(busy_us=80.0, kernels=12.0, top=[dict(name="body_mosaic_gpu_kernel", count=4.0, us=60.0)],
                    host_window=(1.0, 2.0))

    monkeypatch.setattr(mla.timing, "traced_device_time", fake_trace)
    got = mla.traced_in_graph(lambda x: x + 1, [(jnp.ones(2),)] * 4)
    assert seen == dict(sets=4, calls=5)
    assert got == dict(busy_us=20.0, kernels=3.0, top=[dict(name="body_mosaic_gpu_kernel", count=1.0, us=15.0)],
                       host_window=(1.0, 2.0))
    row = dict(ctx=8192, q=1, s=1, impl="mosaic_gpu", flops=1e9, bytes=1e7, floor_ms=0.002, ms=0.07,
               pct_floor=2.9, tflops=14.0, device_ms=0.020, device_pct_floor=10.0, kernels=3.0,
               top_kernels=got["top"])
    assert "device 0.020 ms 10.0% (3 kernels: body_mosaic_gpu_kernel 15.0 us)" in mla.format_row(row)
    assert "| 0.020 | 10.0 |" in mla.table([row])
    assert mla.table([row]).splitlines()[-1].endswith("| mosaic_gpu |  |")         # no clocks sampled
    row.update(wall_clocks=dict(sm_mhz=1755.0), trace_clocks={})
    assert mla.table([row]).splitlines()[-1].endswith("| mosaic_gpu | 1755 / - |")
