"""Benchmark helpers: device time from profiler kernel events, median timing, tables."""

import gzip
import json
import time

import jax
import jax.numpy as jnp
import pytest

from ddtree_jax.bench import timing


def test_kernel_summary_counts_overlaps_once():
    kernels = [dict(name="a", ts=0.0, dur=2.0), dict(name="b", ts=1.0, dur=2.0),
               dict(name="a", ts=10.0, dur=1.0), dict(name="c", ts=10.2, dur=0.5)]
    k = timing.kernel_summary(kernels, per=2, top=2)
    assert k["busy_us"] == pytest.approx((3.0 + 1.0) / 2)       # [0, 3] and [10, 11]
    assert k["span_us"] == pytest.approx(11.0 / 2)               # 0 .. 11, the idle 3 .. 10 included
    assert k["kernels"] == 2.0
    assert k["top"] == [dict(name="a", count=1.0, us=1.5), dict(name="b", count=0.5, us=1.0)]


def test_kernel_timeline_finds_gaps_between_merged_kernels():
    kernels = [dict(ts=0.0, dur=10.0), dict(ts=5.0, dur=20.0), dict(ts=40.0, dur=5.0),
               dict(ts=46.0, dur=4.0), dict(ts=100.0, dur=1.0)]
    t = timing.kernel_timeline(kernels, gap_us=2.0)
    assert t == dict(busy_ms=pytest.approx(0.035), span_ms=pytest.approx(0.101), gaps=2,
                     gap_ms=pytest.approx(0.065), largest_gap_ms=pytest.approx(0.050))


def test_device_kernels_reads_only_device_streams(tmp_path):
    events = [
        dict(ph="M", name="process_name", pid=1, args=dict(name="/host:CPU")),
        dict(ph="M", name="process_name", pid=2, args=dict(name="/device:GPU:0")),
        dict(ph="M", name="thread_name", pid=2, tid=7, args=dict(name="Stream #13(Compute)")),
        dict(ph="M", name="thread_name", pid=2, tid=8, args=dict(name="XLA Ops")),
        dict(ph="X", name="fusion_1", pid=2, tid=7, ts=5.0, dur=2.5),
        dict(ph="X", name="fusion_1", pid=2, tid=8, ts=5.0, dur=2.5),    # an op-level duplicate
        dict(ph="X", name="PjitFunction", pid=1, tid=1, ts=0.0, dur=30.0),
    ]
    d = tmp_path / "plugins" / "profile" / "run"
    d.mkdir(parents=True)
    with gzip.open(d / "host.trace.json.gz", "wt") as f:
        json.dump(dict(traceEvents=events), f)
    kernels, procs = timing.device_kernels(str(tmp_path))
    assert kernels == [dict(name="fusion_1", ts=5.0, dur=2.5)]
    assert procs == ["/device:GPU:0", "/host:CPU"]
    kernels, _ = timing.device_kernels(str(tmp_path), with_args=True)
    assert kernels == [dict(name="fusion_1", ts=5.0, dur=2.5, args={})]


def test_graph_launches_split_a_trace_per_launch():
    """decode_timeline --graph_launches: kernels grouped by their launch (a CUDA graph's share
    one); medians over the launches of more than 20 kernels."""
    # Three launches of 21+ kernels (1 us each, 0.5 us apart), 10 us apart, and one small launch.
    kernels = [dict(ts=100.0 * g + 1.5 * i, dur=1.0, launch=g) for g in range(3) for i in range(22)]
    kernels.append(dict(ts=400.0, dur=2.0, launch=9))
    got = timing.graph_launches(kernels)
    assert got["launches"] == 4 and got["step_launches"] == 3 and got["kernels"] == 22
    assert got["span_us"] == pytest.approx(1.5 * 21 + 1.0)
    assert got["busy_us"] == pytest.approx(22.0)
    assert got["inside_gap_us"] == pytest.approx(0.5 * 21)
    assert got["before_us"] == pytest.approx(100.0 - 32.5)


def test_traced_device_time_is_none_without_a_device():
    if jax.default_backend() != "cpu":
        pytest.skip("checks the CPU answer")
    assert timing.traced_device_time(jax.jit(lambda x: x + 1), jnp.ones(4), calls=2) is None


def test_traced_device_time_cycles_through_arg_sets():
    """arg_sets: one untimed call per set, then the traced calls rotate through the sets."""
    seen = []
    f = jax.jit(lambda x: x + 1)

    def fn(x):
        seen.append(int(x[0]))
        return f(x)

    sets = [(jnp.full(4, v),) for v in (0, 1, 2)]
    timing.traced_device_time(fn, calls=5, arg_sets=sets)
    assert seen == [0, 1, 2, 0, 1, 2, 0, 1]
    with pytest.raises(ValueError, match="arg_sets"):
        timing.traced_device_time(fn, arg_sets=[])


def test_traced_device_time_leaves_out_the_warm_calls(monkeypatch):
    """warm: those calls run inside the trace, their kernels (the earliest) are not counted."""
    seen = []
    f = jax.jit(lambda x: x + 1)

    def fn(x):
        seen.append(int(x[0]))
        return f(x)

    # 3 calls of 2 kernels each, listed out of order; the first call's are slow (an idle GPU)
    fake = [dict(name="g", ts=20.0, dur=4.0), dict(name="g", ts=0.0, dur=9.0), dict(name="d", ts=24.0, dur=1.0),
            dict(name="d", ts=9.0, dur=2.0), dict(name="g", ts=12.0, dur=4.0), dict(name="d", ts=16.0, dur=1.0)]
    monkeypatch.setattr(timing, "device_kernels", lambda d: (fake, []))
    sets = [(jnp.full(4, v),) for v in (0, 1)]
    got = timing.traced_device_time(fn, calls=2, arg_sets=sets, warm=1)
    assert seen == [0, 1, 0, 1, 0]
    assert got["busy_us"] == pytest.approx((5.0 + 5.0) / 2)     # [12, 17] and [20, 25]
    assert got["span_us"] == pytest.approx(13.0 / 2)
    assert got["kernels"] == 2.0
    t0, t1 = got["host_window"]
    assert t0 <= t1 <= time.time()
    with pytest.raises(ValueError, match="warm"):
        timing.traced_device_time(fn, calls=2, warm=-1)


def test_median_seconds_and_table():
    assert timing.median_seconds(jax.jit(lambda x: x * 2), jnp.ones(8), reps=3, inner=2) > 0
    with pytest.raises(ValueError, match="reps"):
        timing.median_seconds(lambda: 0, reps=0)
    table = timing.markdown_table([dict(a=1.23456, b=None)], ["a", "b"])
    assert table.splitlines() == ["| a | b |", "|---|---|", "| 1.23 |  |"]


_HLO = '''
  %input_transpose_fusion.2 = bf16[1,4,65,80]{3,2,1,0} fusion(%a, %b), kind=kInput, calls=%fused_transpose.4, metadata={op_name="jit(_step_and_flag)/while/body/closed_call/verify/jit(_apply)/Decoder/layers_3/self_attn/concatenate" scheduling_name="x"}
  %pallas_call.9 = (f32[15,64]{1,0}) custom-call(%c), custom_call_target="__gpu$xla.gpu.triton", metadata={op_name="jit(_step_and_flag)/tree/jit(_build)/jit(search)/pallas_call"}, backend_config={debug = false, name = "_search_kernel", num_warps = 4 : i32}
  ROOT %fusion.7 = f32[8]{0} fusion(%d), kind=kLoop, calls=%fused_computation.7, metadata={op_name="jit(_step_and_flag)/accept/jit(_where)/select_n"}
  %wrapped_concatenate.4 = bf16[256,208]{1,0} fusion(%e, %f), kind=kLoop, calls=%wrapped_concatenate_computation.4, metadata={scheduling_name="wrapped_concatenate.4"}
  %add.3 = f32[8]{0} add(%g, %h), metadata={op_name="jit(_step_and_flag)/accept/add"}
  %fusion.649 = bf16[1,16,4,32]{3,2,1,0} fusion(%i), kind=kCustom, calls=%fused_computation.536, metadata={deduplicated_name="fusion.649"}
%fused_computation.536 (param_0.1: f32[16]) -> bf16[16] {
  %param_0.1 = f32[16]{0} parameter(0)
  %multiply.1 = f32[16]{0} multiply(%param_0.1, %param_0.1), metadata={op_name="jit(_step_and_flag)/draft/DFlashDrafter/layers_1/self_attn/q_norm/mul"}
  ROOT %convert.2 = bf16[16]{0} convert(%multiply.1), metadata={op_name="jit(_step_and_flag)/draft/DFlashDrafter/layers_1/self_attn/q_norm/convert_element_type"}
}
'''


def test_hlo_kernel_scopes_and_scope_summary():
    scopes = timing.hlo_kernel_scopes(_HLO)
    assert scopes == {"input_transpose_fusion_2": "verify/Decoder/layers_*/self_attn/concatenate",
                      "_search_kernel": "tree", "fusion_7": "accept/select_n",
                      "fusion_649": "draft/DFlashDrafter/layers_*/self_attn/q_norm/convert_element_type"}
    kernels = [dict(name="input_transpose_fusion_2", ts=0.0, dur=9.0),
               dict(name="input_transpose_fusion_2", ts=9.0, dur=8.0),
               dict(name="_search_kernel", ts=20.0, dur=15.0), dict(name="fusion_7", ts=40.0, dur=1.0),
               dict(name="wrapped_concatenate_4", ts=41.0, dur=2.0)]
    s = timing.scope_summary(kernels, per=1, scopes=scopes, depth=3)
    assert s["stages"] == {"verify": dict(kernels=2, us=17.0), "tree": dict(kernels=1, us=15.0),
                           "accept": dict(kernels=1, us=1.0),
                           "unattributed": dict(kernels=1, us=2.0)}
    assert s["scopes"][0] == dict(scope="verify/Decoder/layers_*", kernels=2, us=17.0)
    assert [v["scope"] for v in s["scopes"][1:]] == ["tree", "unattributed/wrapped_concatenate_4",
                                                      "accept/select_n"]
    assert s["parts"] == {"attention projections": dict(kernels=2, us=17.0), "tree": dict(kernels=1, us=15.0),
                          "accept": dict(kernels=1, us=1.0), "unattributed": dict(kernels=1, us=2.0)}


@pytest.mark.parametrize("scope, part", [
    ("verify/Decoder/layers_*/self_attn/attention_core/shard_map", "attention core"),
    ("verify/Decoder/layers_*/self_attn/q_b_proj/dot_general", "attention projections"),
    ("verify/Decoder/layers_*/mlp/router/dot_general", "router"),
    ("verify/Decoder/layers_*/mlp/gate/e_score_correction_bias", "router"),
    ("verify/Decoder/layers_*/mlp/routed_experts/gate_up", "routed experts"),
    ("verify/Decoder/layers_*/mlp/shared_experts/down_proj/dot_general", "shared expert"),
    ("verify/Decoder/layers_*/mlp/add", "MLP"),
    ("verify/Decoder/layers_*/post_attention_layernorm/mul", "norms"),
    ("verify/Decoder/norm/rsqrt", "norms"),
    ("verify/Decoder/lm_head/dot_general", "lm_head"),
    ("verify/Decoder/embed_tokens/gather", "embedding"),
    ("verify/Decoder/layers_*/add", "layer other"),
    ("verify/concatenate", "verify other"),
    ("draft/DFlashDrafter/layers_*/mlp/mul", "draft"),
    ("while/lt", "other"),
    (None, "unattributed")])
def test_part_of_a_scope(scope, part):
    assert timing.part_of(scope) == part


def test_every_verify_op_of_a_compiled_step_has_a_named_part():
    """The compiled engine step's verify ops, by their source scopes (the model's named scopes
    and module names), fall into the account's parts; none is left to "verify other" but the
    stage's own glue, and every part of an MoE target's layer is there."""
    import ddtree_jax as dj
    from ddtree_jax import engine
    cfg = dj.ModelConfig.preset("tiny", num_hidden_layers=2)
    dcfg = dj.DrafterConfig.for_target(cfg, block_size=3, num_hidden_layers=1)
    target, drafter = (cfg, dj.init_target(cfg, jax.random.key(0))), (dcfg, dj.init_drafter(dcfg, jax.random.key(1)))
    su = engine.setup(target, drafter, [[1, 2, 3]], method="ddtree", budget=3, max_new_tokens=4)
    text = engine.decode_steps.lower(target[1], drafter[1], engine.prefill(target, drafter, su),
                                     su.plan).compile().as_text()
    scopes = {"/".join(p for p in op.split("/") if not timing._SKIP_SEGMENT.match(p))
              for op in timing._OP_NAME.findall(text)}
    parts = {timing.part_of(s) for s in scopes if s.startswith("verify/Decoder")}
    assert parts == {"attention core", "attention projections", "router", "routed experts",
                     "shared expert", "MLP", "norms", "lm_head", "embedding", "layer other"}


def test_sustain_calls_back_to_back_for_the_time_given():
    f = jax.jit(lambda x: x + 1)
    t0 = time.perf_counter()
    calls = timing.sustain(f, jnp.ones(4), seconds=0.05)
    assert time.perf_counter() - t0 >= 0.05 and calls >= 8 and calls % 8 == 0


def test_clock_window_summarises_the_samples_in_the_window():
    """GPU 0's samples by default; with gpus=(0, 1) both GPUs' pooled, plus each one's median."""
    import datetime
    base = datetime.datetime(2026, 12, 3, 14, 54, 33)
    ts = lambda ms: (base + datetime.timedelta(milliseconds=ms)).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]  # noqa: E731
    text = "\n".join([
        "timestamp, index, clocks.sm [MHz], power.draw [W], clocks_throttle_reasons.active",   # a header
        f"{ts(0)}, 0, 1980, 125.10, 0x0000000000000000",
        f"{ts(0)}, 1, 1980, 120.00, 0x0000000000000000",
        f"{ts(50)}, 0, 1500, 699.48, 0x0000000000000004",
        f"{ts(50)}, 1, 1800, 650.00, 0x0000000000000000",
        f"{ts(100)}, 0, 1700, 690.00, 0x0000000000000004",
        f"{ts(100)}, 1, 1600, 701.00, 0x0000000000000004",
        f"{ts(150)}, 0, 1980, 430.00, 0x0000000000000000",
        f"{ts(200)}, 0, [N/A], 430.00, 0x0000000000000000",                       # unreadable: skipped
        f"{ts(250)}, 0, 345, 80.00, 0x0000000000000001"])
    t = base.timestamp()
    got = timing.clock_window(text, t + 0.04, t + 0.21)
    assert got == dict(samples=3, sm_mhz=1700.0, sm_mhz_min=1500.0, power_w_max=699.48,
                       power_capped=pytest.approx(2 / 3))
    both = timing.clock_window(text, t + 0.04, t + 0.21, gpus=(0, 1))
    assert both == dict(samples=5, sm_mhz=1700.0, sm_mhz_min=1500.0, power_w_max=701.0,
                        power_capped=pytest.approx(3 / 5), gpu_sm_mhz={0: 1700.0, 1: 1700.0})
    assert timing.clock_window(text, t + 0.12, t + 0.21, gpus=(0, 1))["gpu_sm_mhz"] == {0: 1980.0}
    assert timing.clock_window(text, t + 1.0, t + 2.0) == {}


def test_gpu_clocks_without_nvidia_smi_samples_nothing(monkeypatch):
    import shutil
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with timing.GpuClocks() as clocks:
        assert clocks.window(0.0, time.time()) == {}
    with pytest.raises(ValueError, match="gpus"):
        timing.GpuClocks(gpus=())


def test_load_profile_splits_calls_into_burst_and_sustained(monkeypatch):
    """Each call's kernels (2 per call here, 1 ms apart) by start order; burst = calls starting in
    the first burst_ms, sustained = from settled_s on; the trace's kernels must divide into calls."""
    made = []
    f = jax.jit(lambda x: x + 1)

    def fn(x):
        made.append(int(x[0]))
        return f(x)

    def fake_kernels(d):
        n = len(made) - 2                         # the two untimed calls, one per arg set
        ks = []
        for c in range(n):
            dur = 100.0 if c < 20 else 300.0      # slower once "capped"
            ks += [dict(name="a", ts=c * 1000.0, dur=dur), dict(name="b", ts=c * 1000.0 + dur, dur=dur)]
        return ks[::-1], []                       # any order
    monkeypatch.setattr(timing, "device_kernels", fake_kernels)
    sets = [(jnp.full(4, v),) for v in (0, 1)]
    got = timing.load_profile(fn, sets, load_s=0.3, idle_s=0.0, burst_ms=10.0, settled_s=0.1)
    assert made[:4] == [0, 1, 0, 1] and got["calls"] == len(made) - 2 and got["calls"] % 8 == 0
    assert got["calls"] >= 120                    # 0.3 s of a trivial call (the fake's 1 ms spacing)
    assert got["kernels_per_call"] == 2
    assert got["burst_us"] == 200.0 and got["burst_calls"] == 10
    assert got["sustained_us"] == 600.0 and got["sustained_calls"] == got["calls"] - 100
    with pytest.raises(ValueError, match="settled_s"):
        timing.load_profile(fn, sets, load_s=0.5, settled_s=1.0)
    monkeypatch.setattr(timing, "device_kernels", lambda d: ([dict(name="a", ts=0.0, dur=1.0)] * 3, []))
    with pytest.raises(ValueError, match="not .* calls of one count"):
        timing.load_profile(fn, sets, load_s=0.05, idle_s=0.0, burst_ms=10.0, settled_s=0.02)


def test_load_profile_is_none_without_a_device():
    if jax.default_backend() != "cpu":
        pytest.skip("checks the CPU answer")
    f = jax.jit(lambda x: x + 1)
    assert timing.load_profile(f, [(jnp.ones(4),)], load_s=0.05, idle_s=0.0, burst_ms=10.0,
                                   settled_s=0.02) is None


def test_calls_busy_groups_kernels_by_start_order():
    ks = [dict(ts=105.0, dur=5.0), dict(ts=100.0, dur=3.0), dict(ts=102.0, dur=2.0), dict(ts=110.0, dur=1.0)]
    assert timing.calls_busy(ks, 2) == [(0.0, 4.0), (5.0, 6.0)]   # [100, 104] and [105, 111]
    with pytest.raises(ValueError, match="4 kernels in the trace are not 3 calls"):
        timing.calls_busy(ks, 3)


def test_regimes_takes_medians_of_the_first_and_the_settled_calls():
    """Burst (first burst_ms), its first quarter, sustained (from settled_s); a step inside the burst
    window shows in first_us, not in burst_us."""
    calls = [(0.0, 10.0), (40e3, 12.0), (90e3, 11.0), (150e3, 30.0), (1.0e6, 20.0), (1.5e6, 22.0), (2.0e6, 21.0)]
    got = timing.regimes(calls, 100.0, 102.5, burst_ms=100.0, settled_s=1.0)
    assert got == dict(burst_us=11.0, burst_calls=3, first_us=10.0, first_calls=1, sustained_us=21.0,
                       sustained_calls=3)
    none = timing.regimes(calls[:2], 0.0, 1.0, burst_ms=10.0, settled_s=0.5)
    assert none["burst_us"] == 10.0 and none["sustained_us"] is None and none["sustained_calls"] == 0
    assert none["first_us"] == 10.0 and none["first_calls"] == 1          # the first call at least
    step = [(c * 4e3, 3.4e3 if c < 8 else 3.8e3) for c in range(27)]    # throttled 32 ms in (T = 1024)
    got = timing.regimes(step, 0.0, 0.2, burst_ms=100.0, settled_s=0.15)
    assert got["burst_us"] == 3.8e3 and got["first_us"] == 3.4e3 and got["first_calls"] == 7, got


def _fake_torch(clock: dict):
    """A torch stand-in whose CUDA ops each advance a GPU clock: 100 us while it reads under 5 ms,
    250 us after (a "power cap"); events read that clock."""
    import types

    class Event:
        def __init__(self, enable_timing=False):
            assert enable_timing
            self.t = None

        def record(self):
            self.t = clock["gpu_us"]

        def synchronize(self):
            assert self.t is not None

        def elapsed_time(self, end):             # milliseconds, as torch's
            return (end.t - self.t) / 1e3

    def run():
        clock["ops"] += 1
        clock["gpu_us"] += 100.0 if clock["gpu_us"] < 5e3 else 250.0

    class Buffer:
        def __init__(self, n):
            self.n = n

        def copy_(self, src):
            assert src.n == self.n
            run()

        def __matmul__(self, other):
            assert other.n == self.n
            run()

    cuda = types.SimpleNamespace(Event=Event, synchronize=lambda: None,
                                 empty_cache=lambda: clock.__setitem__("freed", clock["freed"] + 1))
    return types.SimpleNamespace(cuda=cuda, uint8="uint8", bfloat16="bfloat16",
                                 empty=lambda n, device, dtype: Buffer(n), empty_like=lambda b: Buffer(b.n),
                                 randn=lambda n, m, device, dtype: Buffer((n, m)))


@pytest.mark.parametrize("ceiling", ["copy", "matmul"])
def test_sustained_ceilings_time_each_call_by_its_events(monkeypatch, ceiling):
    """sustained_copy / sustained_matmul on a fake torch (100 us per op for the first 5 ms of GPU
    time, 250 us after): each call's us from its own event pair, starts from the first event, the
    rate of each regime (bytes read + written, or 2 n^3 FLOPs), the buffers freed."""
    import sys
    clock = {"gpu_us": 0.0, "ops": 0, "freed": 0}
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(clock))
    load = dict(load_s=0.05, idle_s=0.0, burst_ms=4.0, settled_s=0.01)
    if ceiling == "copy":
        got, unit, work = timing.sustained_copy(nbytes=2**20, **load), "tbps", 2 * 2**20
    else:
        got, unit, work = timing.sustained_matmul(n=64, **load), "tflops", 2 * 64**3
    assert got["calls"] == clock["ops"] - 1 and got["calls"] % 8 == 0 and clock["freed"] == 1
    # one untimed op first: timed ops start at 100 us, 49 of them take 100 us (starts 0 .. 4800
    # after the first), the rest 250 us from 5 ms; 10 ms in is the 21st of those
    assert got["burst_us"] == 100.0 and got["burst_calls"] == 40
    assert got["sustained_us"] == 250.0 and got["sustained_calls"] == got["calls"] - 70
    assert got[f"burst_{unit}"] == work / 100e-6 / 1e12 and got[f"sustained_{unit}"] == work / 250e-6 / 1e12
