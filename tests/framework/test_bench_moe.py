"""ddtree_jax/bench/moe.py (experiments/kernel_bench.py's support): --variants parsing and the
tuned config's neighbours, the whole-output check of untried variants, the device-time split and
the tables, the --budget_s rows (the benchmark itself needs a GPU and torch)."""

import numpy as np
import pytest

from ddtree_jax.bench.moe import (XLA_NO_LOAD, kernel_split, parse_variants, regimes_table, skipped_row,
                                  table, trace_calls, variant_cfgs)
from pallas_kernels.moe import tuning
from tests import FAST_COMPILE, check_python


def test_parse_variants():
    sets = parse_variants('bn_down=256, down_warps=8 ; scale_weights=false;dequant=bits;')
    assert sets == [dict(bn_down=256, down_warps=8), dict(scale_weights=False), dict(dequant='bits')], sets
    cfgs = variant_cfgs(64, sets)
    base = tuning.config(64)
    assert cfgs[0] == base._replace(bn_down=256, down_warps=8) and cfgs[0].bn_up == base.bn_up
    assert cfgs[1].scale_weights is False and cfgs[2].dequant == 'bits'
    for t in (1, 4, 64, 1024):   # the built-in sets when none are given: one knob of the tuned entry moved
        builtin = variant_cfgs(t)
        assert len(builtin) >= 5 and len(set(builtin)) == len(builtin) and tuning.config(t) not in builtin, builtin
        assert all(sum(a != b for a, b in zip(c, tuning.config(t))) == 1 for c in builtin), builtin
        assert any(c.split_k == 4 for c in builtin) == (t <= 4), builtin
    raw = variant_cfgs(4096, parse_variants('bn_up=64;num_warps=8'), raw=True)   # the raw Triton kernels
    assert raw == [tuning.config(4096)._replace(bn_up=64), tuning.config(4096)._replace(num_warps=8)], raw
    assert all(c != tuning.config(4096) for c in raw), raw
    assert variant_cfgs(4096, [dict(bm=64, dequant='bits')])[0].bm == 64
    for t in (1, 64):   # the raw kernels' neighbours leave the fields those kernels ignore alone
        builtin = variant_cfgs(t, raw=True)
        assert builtin and all(c.swap_ab == tuning.config(t).swap_ab and c.split_k == 1 for c in builtin), builtin
        assert set(builtin) < set(variant_cfgs(t)), builtin
    for sets, word in (([dict(bn_up=128), dict(swap_ab=True, split_k=2)], 'split_k, swap_ab'),
                       ([dict(bm=64, num_warps=8)], "dequant='asm'")):   # refused before any device work
        with pytest.raises(ValueError) as e:
            variant_cfgs(64, sets, raw=True)
        assert word in str(e.value), (sets, e.value)
    for bad, word in (('bn_dwn=4', 'bn_dwn'), ('bn_down', 'bn_down'), ('bn_down=x', 'bn_down'),
                      ('swap_ab=maybe', 'swap_ab')):
        with pytest.raises(ValueError) as e:
            parse_variants(bad)
        assert word in str(e.value), (bad, e.value)


ALL_TOKENS_CHECK = """
import jax, jax.numpy as jnp, numpy as np
from ddtree_jax.bench.moe import all_tokens_error
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
    tokens' rows is caught, a NaN gives inf. Interpret mode, fresh seed, in a fresh process
    (FAST_COMPILE)."""
    seed = int(np.random.SeedSequence().generate_state(1)[0])
    check_python(ALL_TOKENS_CHECK.replace("SEED", str(seed)), FAST_COMPILE)


def test_budget_skips_rows_and_keeps_the_table():
    """--budget_s: past it, an implementation and T become a row that says it was skipped, which
    the table prints with every column (so a run cut short still writes its tables); --trace
    profiles fewer calls of the slow baselines (trace_calls)."""
    assert [trace_calls(s) for s in (1e-4, 0.0125, 0.04, 0.08, 2.0)] == [16, 16, 5, 2, 2]   # 0.2 s of calls, 2-16
    assert skipped_row('xla', 256, 400.0, 0) is None              # no budget
    assert skipped_row('xla', 256, 299.0, 300.0) is None          # within it
    row = skipped_row('bf16_weights', 4096, 301.4, 300.0)
    assert row == dict(impl='bf16_weights', T=4096, error='skipped: past --budget_s=300 (301 s in)'), row
    lines = table({'rows': [row]}).splitlines()
    assert len({ln.count('|') for ln in lines}) == 1, lines      # a skipped row has every column
    assert lines[2].startswith('| 4096 | bf16_weights |  |') and 'skipped: past --budget_s=300' in lines[2], lines[2]


def test_kernel_split_and_table():
    """kernel_bench's device-time split (GEMM kernels by their own bytes, the rest as glue) and its
    table: every row has every column, an implementation without those kernels leaves them empty."""
    top = [{'name': 'gate_up', 'us': 500.0}, {'name': 'down', 'us': 250.0},
           {'name': 'loop_reduce_fusion', 'us': 3.0}]
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
    lines = table({'rows': [row, xla, failed]}).splitlines()
    assert len({ln.count('|') for ln in lines}) == 1, lines          # every row has every column
    assert '| 760.0 | 771.5 | 84.9 | 500.0 (80.0) | 250.0 (80.0) | 10.0 | 16 | 1620 / 1980 |' in lines[2], lines[2]
    assert '| nan | nan | nan |  |  |  | nan |  |' in lines[3], lines[3]     # no GEMM kernels: no glue either
    assert 'RESOURCE_EXHAUSTED' in lines[4], lines[4]
    row.update(floor_s=645e-6, burst_pct_copy=88.7, first_pct_copy=91.8, sustained_pct_copy=79.4,
               load=dict(burst_us=726.7, first_us=702.0, sustained_us=812.1, burst_clocks=dict(sm_mhz=1980.0),
                         sustained_clocks={}))
    regimes = regimes_table({'rows': [row, xla]}).splitlines()
    assert len(regimes) == 3 and len({ln.count('|') for ln in regimes}) == 1, regimes     # rows with a profile only
    assert regimes[2] == ('| 16 | triton | 111.0 | 2750 | 645 | 726.7 (88.7, 1980) | 702.0 (91.8) | '
                          '812.1 (79.4, -) | - / - |'), regimes[2]
    ceil = dict(copy_tbps=4.264, copy_load=dict(burst_tbps=4.25, sustained_tbps=4.2, burst_clocks=dict(sm_mhz=1980.0)))
    with_copy = regimes_table({'rows': [row], 'ceilings': ceil}).splitlines()
    assert with_copy[0] == ('copy under the same load: burst 4.250 TB/s (SM 1980 MHz), sustained 4.200 TB/s '
                            '(SM - MHz); % copy below is of 4.264 TB/s (measure_ceilings)'), with_copy[0]
    assert with_copy[2:] == regimes, with_copy
    row.update(burst_pct_copy_load=89.0, sustained_pct_copy_load=80.6)
    assert regimes_table({'rows': [row]}).splitlines()[2].endswith('| 812.1 (79.4, -) | 89.0 / 80.6 |')
    xla.update(floor_s=645e-6, load_skipped=XLA_NO_LOAD)             # a row without a profile says why
    both = regimes_table({'rows': [row, xla]}).splitlines()
    assert len(both) == 4 and len({ln.count('|') for ln in both}) == 1, both
    assert both[3] == f'| 16 | xla | 111.0 | 2750 | 645 | - | - | - | {XLA_NO_LOAD} |', both[3]
    ceil['copy_load'].update(sustained_tbps=None)                   # no copy in a regime: '-', not a crash
    assert 'sustained - TB/s' in regimes_table({'rows': [row], 'ceilings': ceil}).splitlines()[0]
