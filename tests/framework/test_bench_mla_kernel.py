"""ddtree_jax/bench/mla_kernel.py (experiments/mla_kernel_bench.py's support): the Mosaic GPU
kernel lowered for CUDA on the CPU, and the readers of ptxas's report, the kernel's timeline and
the in-kernel profiler's trace."""

import numpy as np
import pytest

from ddtree_jax.bench.mla_kernel import profile_phases, ptxas_summary, timeline_summary
from pallas_kernels.mla_attention.mosaic_gpu import TIMELINE
from tests import FAST_COMPILE, check_python

# Lowering runs over a covering set of the (shape, splits, epilogue) product; each case below is
# run through run_kernel_bench(lower_only=True) in one process (the imports are paid for once).
LOWER_CASES = (dict(shapes=["1024:2:2"], splits=[1, 3], epilogues=["tma", "registers"]),   # cluster 2: all four
               dict(shapes=["1024:3:1"], splits=[1], epilogues=["tma", "registers"]),      # cluster 1, whole
               dict(shapes=["2048:1:2"], splits=[3], epilogues=["tma", "registers"]),      # cluster 1, 3 runs
               dict(shapes=["1024:4:1"], clusters=["4"], splits=[1], epilogues=["tma"]))   # 4 CTAs

LOWER_CHECK = """
import sys
from ddtree_jax.bench import mla_kernel
for case in CASES:
    mla_kernel.run_kernel_bench(case["shapes"], case["splits"], case.get("clusters", ["auto"]), case["epilogues"],
                                heads=64, dk=576, v_dim=512, lower_only=True, profile=True, timeline=True)
    print("ok")
    sys.stdout.flush()
"""


def test_mla_kernel_bench_lowers():
    """run_kernel_bench(lower_only=True, profile=True, timeline=True): the Mosaic GPU kernel
    lowered for CUDA on the CPU, each case three times: as is, with the in-kernel profiler
    (profile: its buffer must fit the shared memory left over) and with the timeline's
    %globaltimer stores (timeline). The kernel's code depends on the cluster (two CTAs when Q's
    64-row blocks pair up, else one), the run count (splits 1: whole contexts; 3: each stream's
    context split into 3 runs, parts indexed by run) and the epilogue (O by TMA from Q's shared
    memory, or from registers); at these shapes (balance off, every row block whole: R a multiple
    of 64, one wave of CTAs) the shape otherwise sets only grid and operand sizes. Every one of
    those 2 x 2 x 2 kernels is lowered, 8 cases (LOWER_CASES; the full product over the 3 shapes
    is 12, 4 of them a second shape of cluster 1 for a combination already lowered):
    1024:2:2 (Q 2 x 64 heads = 2 row blocks, cluster 2, S 2) at splits 1 and 3 with both epilogues;
    1024:3:1 (3 row blocks, cluster 1, S 1) at splits 1 with both epilogues; 2048:1:2 (1 row
    block: decode, cluster 1, S 2) at splits 3 with both epilogues. A ninth, 1024:4:1 with
    clusters ["4"], lowers a 4-CTA cluster, the benchmark's other cluster size
    (docs/kernels/mla_attention.md, "Variants measured and not taken"). (The operands are made and
    prepared on the CPU: FAST_COMPILE.)"""
    out = check_python(f"CASES = {LOWER_CASES!r}\n" + LOWER_CHECK, FAST_COMPILE)
    want = {f"ctx={ctx} Q={q} S={s} splits={k} cluster={cl} epilogue={e}: lowered"
            for ctx, q, s, cl, splits in (("1024", 2, 2, 2, (1, 3)), ("1024", 3, 1, 1, (1,)), ("2048", 1, 2, 1, (3,)))
            for k in splits for e in ("tma", "registers")}
    want.add("ctx=1024 Q=4 S=1 splits=1 cluster=4 epilogue=tma: lowered")
    lines = out.stdout.splitlines()
    assert len(want) == 9 and set(ln for ln in lines if "lowered" in ln) == want, out.stdout
    assert out.stdout.count("lowered") == 9 and lines.count("ok") == len(LOWER_CASES), out.stdout


def test_mla_kernel_bench_reads_the_ptxas_report():
    """The parse of `ptxas -v` (text as ptxas 13.0 printed it for this kernel on the H200)."""
    report = ("ptxas warning : Registers are spilled to local memory in function 'body_mosaic_gpu_kernel', "
              "1392 bytes spill stores, 1360 bytes spill loads\nptxas info    : 0 bytes gmem\n"
              "ptxas info    : Function properties for body_mosaic_gpu_kernel\n"
              "    688 bytes stack frame, 1392 bytes spill stores, 1360 bytes spill loads\n"
              "ptxas info    : Used 168 registers, used 16 barriers, 688 bytes cumulative stack size\n")
    assert ptxas_summary(report) == dict(registers=168, spill_store_bytes=1392, spill_load_bytes=1360)
    assert ptxas_summary("") == {}


def test_mla_kernel_bench_summarises_the_timeline():
    """timeline_summary on a context_attention timeline [S=1, B=2, K=2, point]: the low word of
    %globaltimer wraps between CTAs (the first start is 2^32 - 1000 ns); times come out in us after
    the first start; the run that ends last is run 1."""
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


def test_mla_kernel_bench_reads_the_profiler_trace():
    """profile_phases on a Mosaic GPU profiler trace (B/E events, tid = 1 + warpgroup + 3 CTA): two
    CTAs; consumer 0's "context" entered twice in CTA 1 (summed); CTA 1 starts 2 us late."""
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
