"""The speculative decoding engine: lossless at temperature 0 (token for token) and at temperature 1
(distribution), cache compaction, bad input."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import ddtree_jax as dj
from ddtree_jax import budget, engine
from ddtree_jax.engine import generation
from ddtree_jax.config import ConfigError
from pallas_kernels import registry
from tests.kernel_testing import assert_close, fresh_rng


def _pair(vocab, block, seed=0):
    cfg = dj.ModelConfig.preset("tiny").replace(vocab_size=vocab)
    dcfg = dj.DrafterConfig.for_target(cfg, block_size=block, num_hidden_layers=1)
    tp = dj.init_target(cfg, jax.random.key(seed))
    dp = dj.init_drafter(dcfg, jax.random.key(seed + 1))
    return (cfg, tp), (dcfg, dp)


@pytest.fixture(scope="module")
def pair32():
    """Vocabulary 32: a tree of 16+ nodes covers much of it, so drafts are often accepted."""
    return _pair(32, block=5)


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(0)
    return [rng.integers(0, 32, int(n)).tolist() for n in rng.integers(1, 20, size=24)]


@pytest.fixture(scope="module")
def greedy_ar(pair32, prompts):
    """Plain greedy decoding of 24 streams with per-stream budgets and one stop token."""
    target, drafter = pair32
    max_new = [8 + (i % 5) for i in range(len(prompts))]
    free = engine.generate(target, None, prompts, method="ar", max_new_tokens=max_new, stage_reps=0)
    stop = free.tokens[0][3]          # a token the greedy output actually produces
    stopped = engine.generate(target, None, prompts, method="ar", max_new_tokens=max_new,
                              stop_tokens=(stop,), stage_reps=0)
    return max_new, stop, stopped


@pytest.mark.parametrize("method, budget", [("dflash", 0), ("ddtree", 1), ("ddtree", 6), ("ddtree", 24)])
def test_greedy_speculative_equals_ar(pair32, prompts, greedy_ar, method, budget):
    target, drafter = pair32
    max_new, stop, ar = greedy_ar
    reps = 1 if budget == 6 else 0     # one case also measures the per-stage times
    out = engine.generate(target, drafter, prompts, method=method, budget=budget or 1,
                          max_new_tokens=max_new, stop_tokens=(stop,), stage_reps=reps)
    assert any(len(t) < m for t, m in zip(ar.tokens, max_new)), "some stream must stop early"
    for s, (got, want) in enumerate(zip(out.tokens, ar.tokens)):
        assert got == want, f"stream {s}: {got} != {want}"
    for acc, toks, m in zip(out.acceptance_lengths, out.tokens, max_new):
        assert all(1 <= a <= drafter[0].block_size for a in acc)
        assert sum(acc) >= len(toks) - 1          # the last step may be cut by a stop or max_new
    assert out.tokens_per_second > 0 and out.steps >= 1 and out.tau >= 1
    if method == "ddtree" and budget >= 6:
        assert out.tau > 1.0, "the tree should accept some drafts on a 32-token vocabulary"
    if reps:
        assert set(out.stage_times) == {"draft", "tree", "verify", "accept", "step"}
        assert all(t > 0 for t in out.stage_times.values())


@pytest.mark.parametrize("total", [10, 60, 150, "curve"])
def test_greedy_shared_budget_equals_ar(pair32, prompts, greedy_ar, total):
    """One budget over the 24 streams, at most 6 nodes each: fewer nodes than streams (10: most
    streams verify none), a share (60), everything (150 >= 24 x 6), and a total chosen per step
    from a step-time curve. Tokens equal ar's; with a fixed total every step verifies exactly
    min(total, 6 x its unfinished streams) nodes (each stream has 6 prefixes at vocabulary 32, so a
    finished stream that took any would leave fewer); with the curve, at most its largest total."""
    target, drafter = pair32
    max_new, stop, ar = greedy_ar
    shared = budget.StepTimeCurve((4, 48), (1.0, 1.5)) if total == "curve" else total
    out = engine.generate(target, drafter, prompts, method="ddtree", budget=6, shared_budget=shared,
                          max_new_tokens=max_new, stop_tokens=(stop,), stage_reps=0)
    assert out.tokens == ar.tokens
    assert [len(n) for n in out.tree_nodes] == [len(a) for a in out.acceptance_lengths]
    for i in range(out.steps):
        nodes = [n[i] for n in out.tree_nodes if i < len(n)]
        assert max(nodes) <= 6
        if total == "curve":
            assert sum(nodes) <= 48
        else:
            assert sum(nodes) == min(total, 6 * len(nodes)), (i, nodes)


def test_shared_tree_stage_leaves_finished_streams_out(pair32):
    """stage_tree with a shared budget: the inactive streams get no node and the active ones share
    the total as the golden's shared search over them alone; with a step-time curve, the total has
    the golden's best rate."""
    from ddtree_jax.reference import tree_ref
    from tests.framework.test_shared_tree import separated_logits
    from tests.framework.test_tree import assert_tree_equal

    target, drafter = pair32
    active = np.array([True, False, True, True, False])
    logits = separated_logits(fresh_rng(), 5, drafter[0].block_size - 1, 32, 6)
    curve = budget.StepTimeCurve((2, 9, 16), (1.0, 1.2, 2.5))
    for total in (4, 13, curve):
        plan = engine.setup(target, drafter, [[1]] * 5, method="ddtree", budget=6,
                            shared_budget=total).plan
        tree = jax.jit(engine.stage_tree, static_argnames="plan")(jnp.asarray(logits), jnp.asarray(active),
                                                                 plan=plan)
        if total is curve:    # the chosen total's rate is the golden's best (float32 near-ties aside)
            logp = tree_ref.log_softmax_reference(logits)
            _, rate = tree_ref.shared_total_reference(logp, 6, active, curve.budgets, curve.seconds)
            total = int(np.asarray(tree.num_nodes).sum())
            assert rate[total] >= rate.max() * (1 - 1e-5)
        assert_tree_equal(tree, tree_ref.build_shared_tree_reference(logits, total, 6, active))
        assert not np.asarray(tree.num_nodes)[~active].any()


def test_timed_decodes_that_disagree_are_refused(pair32, prompts, monkeypatch):
    """generate checks its timing_reps decodes give the same tokens: a second decode that
    emits other tokens (here: shifted by one) raises instead of reporting tokens/s."""
    target, _ = pair32
    real, calls = engine.run_decode, []

    def second_differs(*args, **kwargs):
        state = real(*args, **kwargs)
        calls.append(1)
        return state if len(calls) == 1 else state.replace(out_tokens=state.out_tokens + 1)
    monkeypatch.setattr(generation, "run_decode", second_differs)
    with pytest.raises(RuntimeError, match="timing_reps"):
        engine.generate(target, None, prompts[:2], method="ar", max_new_tokens=4, timing_reps=2, stage_reps=0)
    assert len(calls) == 2


@pytest.mark.parametrize("loop", ["host", "device"])
def test_several_steps_per_call_change_nothing_but_dispatches(pair32, prompts, greedy_ar, loop):
    """Steps fused into one call (a device loop) emit what one step per call emits, step by step,
    including streams that finish in the middle of a call, whether the host dispatches the calls
    or one call runs the whole decode; repeated timed decodes agree too. The device loop stops at
    its first check after the last stream is done."""
    target, drafter = pair32
    max_new, stop, ar = greedy_ar
    kw = dict(method="ddtree", budget=6, max_new_tokens=max_new, stop_tokens=(stop,), stage_reps=0)
    one = engine.generate(target, drafter, prompts, decode_loop="host", **kw)
    fused = engine.generate(target, drafter, prompts, steps_per_call=3, timing_reps=2,
                            decode_loop=loop, **kw)
    assert fused.tokens == ar.tokens
    assert fused.acceptance_lengths == one.acceptance_lengths
    assert fused.steps == one.steps and fused.tau == one.tau
    if loop == "device":
        assert fused.steps <= fused.device_steps <= fused.steps + 2


@pytest.mark.parametrize("stop", [False, True])
@pytest.mark.parametrize("loop", ["host", "device"])
def test_ar_decode_loops_agree(pair32, prompts, greedy_ar, loop, stop):
    """ar through either loop equals plain greedy decoding; without stop tokens the host loop
    runs exactly the known steps (rounded up to whole calls), reading no counts."""
    target, drafter = pair32
    max_new, stop_token, ar = greedy_ar
    out = engine.generate(target, None, prompts, method="ar", max_new_tokens=max_new,
                          stop_tokens=(stop_token,) if stop else (), steps_per_call=3,
                          stage_reps=0, decode_loop=loop)
    if stop:
        assert out.tokens == ar.tokens
    else:
        assert [len(t) for t in out.tokens] == max_new
        assert [t[:len(a)] for t, a in zip(out.tokens, ar.tokens)] == ar.tokens
    assert out.steps == max(len(t) for t in out.tokens) - 1
    if loop == "host" and not stop:
        assert out.device_steps == -(-out.steps // 3) * 3


def test_device_loop_graph_options_change_nothing_but_the_executable(pair32, prompts, greedy_ar):
    """The device loop compiled with DEVICE_LOOP_GRAPHS (valid XLA options: a bad value would fail
    the compile) and with XLA's defaults: the same final state, greedy ar's tokens."""
    target, drafter = pair32
    max_new, stop, ar = greedy_ar
    su = engine.setup(target, drafter, prompts[:4], method="ddtree", budget=6,
                      max_new_tokens=max_new[:4], stop_tokens=(stop,))
    state = engine.prefill(target, drafter, su)
    finals = []
    for graphs in (True, False):
        call = engine.compile_decode(target[1], drafter[1], state, su, 2, "device",
                                     device_graphs=graphs)
        s = engine.run_decode(call, target[1], drafter[1], engine.copy_tree(state), su, 2, "device")
        finals.append(jax.tree_util.tree_map(np.asarray, (s.out_tokens, s.out_len, s.accept)))
    for a, b in zip(*finals):
        np.testing.assert_array_equal(a, b)
    out_tokens, out_len, _ = finals[0]
    assert [out_tokens[i, :out_len[i]].tolist() for i in range(4)] == ar.tokens[:4]


@pytest.mark.parametrize("loop", ["device", "host"])
def test_compiled_decode_keeps_its_buffers(pair32, prompts, greedy_ar, loop):
    """Decodes of two prefilled batches through one CompiledDecode, each `load`ed first, then one
    from a prefill written into its buffers: every final state sits at the same device addresses,
    the loaded states stay intact, the first final state is reused by the second load, and every
    decode emits greedy ar's tokens."""
    target, drafter = pair32
    _, stop, ar = greedy_ar
    batches = [slice(0, 3), slice(3, 6)]
    sus = [engine.setup(target, drafter, prompts[b], method="ddtree", budget=6,
                        max_new_tokens=8, stop_tokens=(stop,), max_len=64) for b in batches]
    states = [engine.prefill(target, drafter, su) for su in sus]
    call = engine.compile_decode(target[1], drafter[1], states[0], sus[0], 2, loop)
    finals, pointers = [], []
    for b, su, state in zip(batches, sus, states):
        s = engine.run_decode(call, target[1], drafter[1], call.load(state), su, 2, loop)
        pointers.append([x.unsafe_buffer_pointer() for x in jax.tree_util.tree_leaves(s)])
        finals.append(s)
        # copies: on the CPU np.asarray would share the buffers and keep them from being reused
        out_tokens, out_len = np.array(s.out_tokens), np.array(s.out_len)
        want = [t[:8] for t in ar.tokens[b]]   # every ar budget here is >= 8
        assert [out_tokens[i, :out_len[i]].tolist() for i in range(3)] == want
    assert pointers[0] == pointers[1]
    assert all(x.is_deleted() for x in jax.tree_util.tree_leaves(finals[0]))
    assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(states))
    # a prefill written straight into the call's buffers: no load, the same addresses and tokens
    state = engine.prefill(target, drafter, sus[0], into=call)
    assert [x.unsafe_buffer_pointer() for x in jax.tree_util.tree_leaves(state)] == pointers[0]
    s = engine.run_decode(call, target[1], drafter[1], state, sus[0], 2, loop)
    out_tokens, out_len = np.array(s.out_tokens), np.array(s.out_len)
    assert [out_tokens[i, :out_len[i]].tolist() for i in range(3)] == [t[:8] for t in ar.tokens[:3]]


def test_drafter_kernel_keeps_generation_lossless(pair32, prompts, greedy_ar):
    """The drafter's attention through the Pallas kernel (interpret mode here): still greedy ar's
    tokens; a bad implementation name is an error that names the argument."""
    target, drafter = pair32
    max_new, stop, ar = greedy_ar
    out = engine.generate(target, drafter, prompts[:6], method="ddtree", budget=6,
                          max_new_tokens=max_new[:6], stop_tokens=(stop,), stage_reps=0,
                          drafter_attn_impl="pallas_triton")
    assert out.tokens == ar.tokens[:6]
    with pytest.raises(ValueError, match="drafter_attn_impl"):
        engine.generate(target, drafter, [[1]], drafter_attn_impl="cuda")


def test_attn_balance_reaches_the_attention_and_keeps_tokens(pair32, prompts, greedy_ar, monkeypatch):
    """serve's attn_balance (default True: ragged slots, the case it is for): every target
    attention call, prefill and verify, gets the hint (pallas_kernels.mla_attention's balance),
    and the tokens are greedy ar's; False reaches the plan too."""
    target, drafter = pair32
    max_new, stop, ar = greedy_ar
    xla = registry._REGISTRY["mla_attention"]["xla"]
    hints = []
    monkeypatch.setitem(registry._REGISTRY["mla_attention"], "xla",
                        lambda *a, **k: hints.append(k.get("balance")) or xla(*a, **k))
    out = dj.serve(target, drafter, prompts[:6], streams=3, method="ddtree", budget=6,
                   max_new_tokens=max_new[:6], stop_tokens=(stop,), attn_impl="xla")
    assert out.tokens == ar.tokens[:6]
    assert hints and set(hints) == {True}, hints
    assert engine.setup(target, drafter, [[1]]).plan.kernels.attn_balance is True
    assert engine.setup(target, drafter, [[1]], attn_balance=False).plan.kernels.attn_balance is False


def test_decode_loop_choice(pair32):
    """"auto": the host loop only where the steps are known before the start (ar without stop
    tokens), the device loop otherwise; a bad name is an error that names the argument."""
    target, drafter = pair32
    plan = lambda **kw: engine.setup(target, drafter, [[1]], **kw).plan   # noqa: E731
    assert engine.decode_loop_for(plan(method="ar")) == "host"
    assert engine.decode_loop_for(plan(method="ar", stop_tokens=(3,))) == "device"
    assert engine.decode_loop_for(plan(method="ddtree", budget=4)) == "device"
    assert engine.decode_loop_for(plan(method="dflash")) == "device"
    assert engine.decode_loop_for(plan(method="ddtree", budget=4), "host") == "host"
    assert engine.decode_loop_for(plan(method="ar"), "device") == "device"
    with pytest.raises(ValueError, match="decode_loop"):
        engine.generate(target, drafter, [[1]], method="ar", decode_loop="gpu")


@pytest.mark.parametrize("method, streams, steps_per_call, shared", [
    ("ddtree", 5, 1, None), ("ar", 7, 3, None), ("ddtree", 5, 2, 8)])
def test_serve_refills_slots_and_equals_generate(pair32, prompts, greedy_ar, method, streams,
                                                 steps_per_call, shared):
    """24 requests through fewer slots (each refilled with the next request as soon as the host
    sees it done, some stopping early, some admitted mid-call): every request's greedy output equals
    the static batch's, and its acceptance lengths account for its tokens. With a shared budget
    of 8 over the 5 slots, no request's step verifies more than 6 nodes."""
    target, drafter = pair32
    max_new, stop, ar = greedy_ar
    out = dj.serve(target, drafter, prompts, streams=streams, method=method, budget=6,
                   shared_budget=shared, max_new_tokens=max_new, stop_tokens=(stop,),
                   steps_per_call=steps_per_call)
    assert [len(n) for n in out.tree_nodes] == [len(a) for a in out.acceptance_lengths]
    assert all(0 <= n <= (6 if method == "ddtree" else 0) for row in out.tree_nodes for n in row)
    assert len(out.tokens) == len(prompts)
    for r, (got, want) in enumerate(zip(out.tokens, ar.tokens)):
        assert got == want, f"request {r}: {got} != {want}"
    for acc, toks in zip(out.acceptance_lengths, out.tokens):
        assert sum(acc) >= len(toks) - 1 and all(a >= 1 for a in acc)
        assert method != "ar" or acc == [1] * len(acc)
    # fewer slots than requests: more steps than any one request needs, fewer than one at a time
    per_request = [len(a) for a in out.acceptance_lengths]
    assert max(per_request) <= out.steps < sum(per_request)
    assert out.tokens_per_second > 0 and out.prefill_seconds > 0
    assert len(out.request_seconds) == len(prompts)
    assert all(0 < t <= out.decode_seconds for t in out.request_seconds)


def test_admission_sizes():
    """Slots seen done together are refilled by one call padded to one of these sizes."""
    from ddtree_jax.serving import batch_sizes
    assert batch_sizes(1) == (1,) and batch_sizes(2) == (1, 2) and batch_sizes(7) == (1, 4, 7)
    assert batch_sizes(16) == (1, 4, 16) and batch_sizes(17) == (1, 4, 16, 17)


def test_serve_more_slots_than_requests_and_bad_input(pair32, prompts, greedy_ar):
    target, drafter = pair32
    max_new, stop, ar = greedy_ar
    out = dj.serve(target, drafter, prompts[:3], streams=8, method="ar", max_new_tokens=max_new[:3],
                   stop_tokens=(stop,))
    assert out.tokens == ar.tokens[:3]
    for bad in (0, 1.5):
        with pytest.raises(ValueError, match="streams"):
            dj.serve(target, drafter, prompts[:3], streams=bad, method="ar")
    with pytest.raises(ValueError, match="steps_per_call"):
        dj.serve(target, drafter, prompts[:3], streams=2, method="ar", steps_per_call=0)


@pytest.mark.parametrize("shared", [None, 5])
def test_compaction_keeps_caches_equal_to_a_fresh_prefill(pair32, prompts, shared):
    """After several ddtree steps, each stream's committed latent cache and drafter context equal
    those of running its committed tokens through the target (and drafter) from scratch; also
    with 5 nodes shared by the 4 streams (trees of 0 to 5 real nodes among 8 slots)."""
    target, drafter = pair32
    (cfg, tp), (dcfg, dp) = target, drafter
    su = engine.setup(target, drafter, prompts[:4], method="ddtree", budget=8, shared_budget=shared,
                      max_new_tokens=12)
    state = engine.prefill(target, drafter, su)
    for _ in range(3):
        state, _ = engine.decode_steps(tp, dp, state, su.plan)
    lengths = np.asarray(state.tcache.lengths)
    out_len = np.asarray(state.out_len)
    committed = [su.prompts[s, :su.lengths[s]].tolist() + np.asarray(state.out_tokens[s, :out_len[s] - 1]).tolist()
                 for s in range(4)]
    n = np.array([len(c) for c in committed], np.int32)
    np.testing.assert_array_equal(n, lengths)
    np.testing.assert_array_equal(n, np.asarray(state.dcache.lengths))
    toks = np.zeros((4, n.max()), np.int32)
    for s, c in enumerate(committed):
        toks[s, :len(c)] = c
    pos = np.broadcast_to(np.arange(n.max()), toks.shape)
    fresh = dj.forward(tp, cfg, toks, pos, dj.init_cache(cfg, 4, n.max()), num_new=n,
                       taps=dcfg.target_layer_ids)
    ctx = dj.append_context(dp, dcfg, dj.init_drafter_cache(dcfg, 4, n.max(), jnp.float32), fresh.taps,
                            pos, n)
    for s in range(4):
        for layer in range(cfg.num_hidden_layers):
            assert_close(state.tcache.kv[layer][s, :n[s]], fresh.cache.kv[layer][s, :n[s]], 1e-5,
                         f"stream {s} layer {layer}")
        assert_close(state.dcache.k[:, s, :, :n[s]], ctx.k[:, s, :, :n[s]], 1e-5, f"stream {s} drafter k")
        assert_close(state.dcache.v[:, s, :, :n[s]], ctx.v[:, s, :, :n[s]], 1e-5, f"stream {s} drafter v")


def _exact_joint(target, prompt, vocab, n_tok, sampling):
    """Exact probability of each sequence of the first n_tok emitted tokens: [vocab] * n_tok."""
    cfg, tp = target
    from ddtree_jax.sampling import target_log_probs
    joint = np.ones((1,))
    for depth in range(n_tok):
        prefixes = list(itertools.product(range(vocab), repeat=depth))
        toks = np.array([prompt + list(p) for p in prefixes], np.int32)
        logp = np.asarray(target_log_probs(dj.target_logits(tp, cfg, toks)[:, -1], sampling), np.float64)
        joint = (joint[:, None] * np.exp(logp)).reshape(-1)
    return joint


@pytest.mark.parametrize("method, budget, top_k, top_p, shared", [
    ("ddtree", 5, 0, 1.0, None), ("ddtree", 4, 5, 0.85, None), ("ddtree", 5, 0, 1.0, 4000)])
def test_temperature_one_is_lossless(method, budget, top_k, top_p, shared):
    """The first three emitted tokens of 6000 streams follow the target's exact distribution; also
    with 4000 nodes shared by the 6000 streams (at most 5 each: many streams verify none)."""
    vocab, n_tok, streams = 6, 3, 6000
    target, drafter = _pair(vocab, block=4, seed=3)
    prompt = [1, 4, 2, 0, 5]
    from ddtree_jax.sampling import Sampling
    exact = _exact_joint(target, prompt, vocab, n_tok, Sampling(1.0, top_k, top_p))
    out = engine.generate(target, drafter, [prompt] * streams, method=method, budget=budget,
                          shared_budget=shared, max_new_tokens=n_tok, temperature=1.0, top_k=top_k,
                          top_p=top_p, seed=7, stage_reps=0)
    seqs = np.array([t[:n_tok] for t in out.tokens])
    idx = np.ravel_multi_index(seqs.T, (vocab,) * n_tok)
    counts = np.bincount(idx, minlength=vocab ** n_tok)
    assert counts[exact == 0].sum() == 0, "sampled a sequence the target forbids (top-k/top-p)"
    keep = exact > 0
    expected = exact[keep] * streams
    # merge sparse cells so every expected count is >= 5 (chi-square validity)
    order = np.argsort(expected)
    obs, exp_ = counts[keep][order], expected[order]
    cut = np.searchsorted(np.cumsum(exp_), 5.0) + 1
    obs = np.concatenate([[obs[:cut].sum()], obs[cut:]])
    exp_ = np.concatenate([[exp_[:cut].sum()], exp_[cut:]])
    p = stats.chisquare(obs, exp_ * obs.sum() / exp_.sum()).pvalue
    assert p > 1e-3, f"chi-square p = {p:.2e}: emitted tokens do not follow the target"
    if method == "ddtree":
        assert out.tau > 1.0
    if shared:
        assert sum(n[0] for n in out.tree_nodes) == shared


def test_bad_input(pair32):
    target, drafter = pair32
    cfg, dcfg = target[0], drafter[0]
    with pytest.raises(ValueError, match="budget"):
        engine.generate(target, drafter, [[1, 2]], method="ddtree", budget=0)
    with pytest.raises(ValueError, match="method"):
        engine.generate(target, drafter, [[1, 2]], method="beam")
    with pytest.raises(ValueError, match="steps_per_call"):
        engine.generate(target, drafter, [[1, 2]], method="ar", steps_per_call=0)
    with pytest.raises(ValueError, match="timing_reps"):
        engine.generate(target, drafter, [[1, 2]], method="ar", timing_reps=0)
    with pytest.raises(ValueError, match="needs a drafter"):
        engine.generate(target, None, [[1, 2]], method="dflash")
    with pytest.raises(ValueError, match="longer than the cache"):
        engine.generate(target, drafter, [[1] * 30], method="ddtree", budget=4, max_new_tokens=8,
                        max_len=32)
    with pytest.raises(ValueError, match="prompt token ids"):
        engine.generate(target, drafter, [[1, 99]], method="ar")
    with pytest.raises(ValueError, match="non-empty"):
        engine.generate(target, drafter, [[]], method="ar")
    with pytest.raises(ValueError, match="temperature"):
        engine.generate(target, drafter, [[1]], method="ar", temperature=-1.0)
    with pytest.raises(ConfigError, match="vocab_size"):
        engine.generate(target, (dcfg.replace(vocab_size=64), drafter[1]), [[1]], method="dflash")
    with pytest.raises(ConfigError, match="hidden_size"):
        engine.generate(target, (dcfg.replace(hidden_size=32), drafter[1]), [[1]], method="dflash")
    with pytest.raises(ConfigError, match="block_size"):
        dcfg.replace(block_size=1)
    with pytest.raises(ConfigError, match="target_layer_ids"):
        dcfg.replace(target_layer_ids=(cfg.num_hidden_layers,))
    with pytest.raises(ValueError, match="non-finite"):
        dj.build_tree(jnp.array([[[0.0, jnp.nan]]]), 2)


@pytest.mark.parametrize("kw, match", [
    ({"budget": True}, r"budget must be an int >= 1, got True"),
    ({"budget": 2.0}, r"budget must be an int >= 1, got 2.0"),
    ({"max_new_tokens": 3.9}, r"max_new_tokens must hold integers, got dtype float64"),
    ({"max_new_tokens": True}, r"max_new_tokens must hold integers, got dtype bool"),
    ({"max_new_tokens": [4, 4, 4]},
     r"max_new_tokens must be one int or one per prompt \(2\), got shape \(3,\)"),
    ({"prompts": [[1, 2], [1.0, 2.5]]}, r"prompts\[1\] must hold integers, got dtype float64"),
    ({"prompts": [[1, 2], [[1, 2]]]}, r"prompts\[1\] must be a list of token ids"),
    ({"stop_tokens": 2.0}, r"stop_tokens must hold integers, got dtype float64"),
    ({"stop_tokens": [[1], [2]]}, r"stop_tokens must be one token id or a list of them"),
    ({"shared_budget": -1}, r"shared_budget must be None, an int >= 0 or a budget.StepTimeCurve, got -1"),
    ({"shared_budget": 2.5}, r"shared_budget must be None, an int >= 0 or a budget.StepTimeCurve"),
    ({"shared_budget": True}, r"shared_budget must be None, an int >= 0 or a budget.StepTimeCurve, got True"),
    ({"shared_budget": "8"}, r"shared_budget must be None, an int >= 0 or a budget.StepTimeCurve"),
    ({"shared_budget": 8, "method": "dflash"}, r"shared_budget is a total of tree nodes: it needs method 'ddtree'"),
])
def test_setup_rejects_bad_arguments(pair32, kw, match):
    target, drafter = pair32
    kw = {"prompts": [[1, 2], [3]], **kw}
    kw = {"method": "ddtree", **kw}
    with pytest.raises(ValueError, match=match):
        engine.setup(target, drafter, kw.pop("prompts"), **kw)


def test_generate_and_serve_share_the_argument_checks(pair32):
    target, drafter = pair32
    for stop, plan_stop in [(3, (3,)), (np.array([3, 4]), (3, 4)), ([], ())]:
        su = engine.setup(target, drafter, [[1]], method="ar", stop_tokens=stop)
        assert su.plan.stop_tokens == plan_stop
    for run in (engine.generate, functools.partial(dj.serve, streams=1)):
        with pytest.raises(ValueError, match="budget must be an int >= 1, got True"):
            run(target, drafter, [[1]], method="ddtree", budget=True)
        with pytest.raises(ValueError, match="steps_per_call must be an int >= 1, got True"):
            run(target, drafter, [[1]], method="ar", steps_per_call=True)
        with pytest.raises(ValueError, match="shared_budget is a total of tree nodes"):
            run(target, drafter, [[1]], method="ar", shared_budget=4)
    with pytest.raises(ValueError, match="decode_loop must be one of"):
        engine.generate(target, drafter, [[1]], method="ar", decode_loop="gpu")
    with pytest.raises(ValueError, match="max_lag must be an int >= 1, got 1.5"):
        dj.serve(target, drafter, [[1]], streams=1, method="ar", max_lag=1.5)


@pytest.mark.parametrize("kw, match", [
    ({"temperature": float("nan")}, r"temperature must be finite and >= 0, got nan"),
    ({"temperature": float("inf")}, r"temperature must be finite"),
    ({"temperature": -0.5}, r"temperature must be finite and >= 0"),
    ({"top_k": 2.5}, r"top_k must be an int >= 0, got 2.5"),
    ({"top_k": True}, r"top_k must be an int >= 0, got True"),
    ({"top_k": -1}, r"top_k must be an int >= 0"),
    ({"top_p": float("nan")}, r"top_p must lie in \(0, 1\], got nan"),
])
def test_sampling_rejects_bad_values(kw, match):
    from ddtree_jax.sampling import Sampling
    with pytest.raises(ValueError, match=match):
        Sampling(**kw)


def test_copy_tree_gives_new_buffers():
    tree = {"a": jnp.arange(4), "b": (jnp.ones((2, 3)), None)}
    copy = engine.copy_tree(tree)
    assert jax.tree_util.tree_structure(copy) == jax.tree_util.tree_structure(tree)
    for x, y in zip(jax.tree_util.tree_leaves(tree), jax.tree_util.tree_leaves(copy)):
        np.testing.assert_array_equal(x, y)
        assert x.unsafe_buffer_pointer() != y.unsafe_buffer_pointer()


class _Counts:
    """A call's `left` counts as `decode` sees them: ready (the device is ahead of the host) or
    not (decode blocks on them only when max_lag calls are outstanding); readable=False: any use
    fails the test."""

    def __init__(self, left, ready: bool, readable: bool = True):
        self.left, self.ready, self.readable = np.asarray(left), ready, readable

    def copy_to_host_async(self):
        assert self.readable, "decode touched counts it was told it need not read"

    def is_ready(self):
        assert self.readable, "decode touched counts it was told it need not read"
        return self.ready

    def __array__(self, dtype=None, copy=None):
        assert self.readable, "decode touched counts it was told it need not read"
        return self.left


def _fake_decode(per_step, max_new, max_calls, steps_per_call=1, max_lag=2, ready=False,
                 known=False):
    """engine.decode over a fake step in which stream i emits per_step[t][i] tokens at step t
    (the last row repeats); returns (calls dispatched, steps a stream needed at most). known:
    decode is told left0 and the steps needed, and must read no counts."""
    calls = []
    per_step = np.asarray(per_step)

    def emit(t):
        return per_step[min(t, len(per_step) - 1)]

    def step(tparams, dparams, state):
        calls.append(int(state.step))
        out_len, t = state.out_len, int(state.step)
        for _ in range(steps_per_call):
            out_len = jnp.where(state.done, out_len, jnp.minimum(out_len + emit(t), state.max_new))
            state = state.replace(out_len=out_len, done=out_len >= state.max_new)
            t += 1
        state = state.replace(step=jnp.int32(t))
        return state, _Counts(engine.tokens_left(state), ready, readable=not known)

    s = len(max_new)
    state = engine.EngineState(tcache=None, dcache=None, pending=None, out_tokens=None,
                               out_len=jnp.ones((s,), jnp.int32), accept=None, nodes=None,
                               done=jnp.asarray(np.asarray(max_new) <= 1),
                               max_new=jnp.asarray(max_new, jnp.int32),
                               step=jnp.zeros((), jnp.int32), key=None)
    need, out_len = 0, np.ones(s, int)
    while (out_len < np.asarray(max_new)).any():
        out_len = np.minimum(out_len + emit(need), max_new)
        need += 1
    hint = dict(left0=np.maximum(np.asarray(max_new) - 1, 0), known_steps=need) if known else {}
    out = engine.decode(step, None, None, state, max_calls, max_lag=max_lag,
                        steps_per_call=steps_per_call, **hint)
    assert int(out.step) == len(calls) * steps_per_call
    if len(calls) * steps_per_call >= need:
        assert bool(jnp.all(out.done))
    return len(calls), need


@pytest.mark.parametrize("ready", [False, True])
@pytest.mark.parametrize("max_new, max_calls", [([11, 6, 2], 20), ([4, 3], 20), ([30], 12)])
def test_decode_paces_exact_progress_without_waste(max_new, max_calls, ready):
    """One token per step (ar): once counts arrive the prediction is exact, so decode dispatches
    just the calls needed (none if every stream is done), never more than max_calls."""
    calls, need = _fake_decode([[1] * len(max_new)], max_new, max_calls, ready=ready)
    assert calls == min(need, max_calls)
    calls, _ = _fake_decode([[1]], [1], max_calls, ready=ready)
    assert calls == 0


@pytest.mark.parametrize("steps_per_call", [1, 3])
@pytest.mark.parametrize("max_new, max_calls", [([11, 6, 2], 20), ([30], 4), ([1, 1], 5)])
def test_decode_dispatches_known_steps_without_reads(max_new, max_calls, steps_per_call):
    """Told the steps that finish every stream (ar without stop tokens), decode dispatches the
    calls that run them (never more than max_calls) and reads no counts."""
    calls, need = _fake_decode([[1] * len(max_new)], max_new, max_calls,
                               steps_per_call=steps_per_call, known=True)
    assert calls == min(-(-need // steps_per_call), max_calls)


@pytest.mark.parametrize("steps_per_call", [1, 3])
@pytest.mark.parametrize("ready", [False, True])
def test_decode_recovers_from_a_short_prediction(steps_per_call, ready):
    """Speculative progress that slows down (8 tokens per step, then 1): the prediction proves
    short, decode waits, finds streams not done and dispatches again until they are; it
    overshoots by at most max_lag calls plus the rest of the last useful call."""
    per_step = [[8, 8]] * 3 + [[1, 1]]
    calls, need = _fake_decode(per_step, [60, 40], 100, steps_per_call=steps_per_call, ready=ready)
    useful = -(-need // steps_per_call)
    assert useful <= calls <= useful + 2


def test_compiled_step_names_its_stages(pair32):
    """The fused step's ops carry the engine's stage scopes, which step_profile splits time by."""
    from ddtree_jax.bench import timing
    target, drafter = pair32
    su = engine.setup(target, drafter, [[1, 2, 3]], method="ddtree", budget=4, max_new_tokens=4)
    state = engine.prefill(target, drafter, su)
    hlo = engine.decode_steps.lower(target[1], drafter[1], state, su.plan).compile().as_text()
    stages = {s.split("/")[0] for s in timing.hlo_kernel_scopes(hlo).values()}
    assert set(timing.STAGES) <= stages, stages
