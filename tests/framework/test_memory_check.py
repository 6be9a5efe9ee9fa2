"""A decode whose caches, tree and logits cannot fit is refused before anything is allocated, with
what it needs and what is free; the bound counts the shapes it names."""

import io
import math

import jax
import numpy as np
import pytest

import ddtree_jax as dj
from ddtree_jax import engine
from ddtree_jax.engine import memory


@pytest.fixture(scope="module")
def pair():
    cfg = dj.ModelConfig.preset("tiny")
    dcfg = dj.DrafterConfig.for_target(cfg, num_hidden_layers=1, block_size=4)
    return (cfg, dj.init_target(cfg, jax.random.key(0))), (dcfg, dj.init_drafter(dcfg, jax.random.key(1)))


def test_step_bytes_count_every_named_buffer(pair):
    (cfg, _), (dcfg, _) = pair
    plan = engine.Plan(cfg, dcfg, "ddtree", 40, dj.Sampling(), ())
    parts = memory.step_bytes(plan, streams=3, max_len=128, itemsize=4)
    n = 41
    assert parts == {
        "target_cache": cfg.num_hidden_layers * 3 * 128 * cfg.latent_dim * 4,
        "verify": 3 * n * (cfg.vocab_size * 4 + 3 * cfg.hidden_size * 4),
        "drafter_cache": 2 * dcfg.num_hidden_layers * 3 * dcfg.num_key_value_heads * 128 * dcfg.head_dim * 4,
        "draft_logits": 3 * dcfg.block_size * cfg.vocab_size * 4,
        "tree": 3 * n * (n + 4 * math.ceil(n / 32))}
    # the caches it counts are the ones the engine allocates
    cache = jax.eval_shape(lambda: dj.model.init_cache(cfg, 3, 128, np.float32))
    assert parts["target_cache"] == sum(math.prod(a.shape) * 4 for a in cache.kv)
    sampled = memory.step_bytes(engine.Plan(cfg, dcfg, "ddtree", 40, dj.Sampling(temperature=1.0), ()),
                                streams=3, max_len=128, itemsize=4)
    assert sampled["verify"] == parts["verify"] + 3 * n * cfg.vocab_size * 4
    ar = memory.step_bytes(engine.Plan(cfg, None, "ar", 0, dj.Sampling(), ()), 3, 128, 4)
    assert set(ar) == {"target_cache", "verify"}


@pytest.mark.parametrize("call", ["generate", "serve"])
def test_a_decode_that_cannot_fit_is_refused_by_budget(pair, monkeypatch, call):
    target, drafter = pair
    monkeypatch.setattr(memory, "free_bytes", lambda device: 2 ** 16)     # 64 KiB free
    run = (dj.generate if call == "generate"
           else lambda *a, **k: dj.serve(*a, streams=2, **k))
    with pytest.raises(ValueError, match=r"budget=64 with 2 stream\(s\) and \d+ cache slots each needs at "
                                         r"least [\d.]+ GiB beyond the params \(.*verify.*\), but "
                                         r"0\.00 GiB is free on 1 device\(s\): lower the budget"):
        run(target, drafter, [[1, 2, 3]] * 2, method="ddtree", budget=64, max_new_tokens=4)


def test_a_decode_that_fits_is_not_refused(pair, monkeypatch):
    target, drafter = pair
    calls = []
    real = memory.free_bytes
    monkeypatch.setattr(memory, "free_bytes", lambda device: calls.append(device) or real(device))
    out = dj.generate(target, drafter, [[1, 2, 3]], method="ddtree", budget=8, max_new_tokens=3,
                      stage_reps=0, warmup=False)
    assert calls and len(out.tokens[0]) == 3


def test_a_budget_beyond_the_hosts_memory_is_refused_on_the_real_count(pair):
    """No stand-in for the free memory: a 2^20-node tree's [N, N] visibility alone is 1 TiB."""
    target, drafter = pair
    with pytest.raises(ValueError, match=r"budget=1048576 with 1 stream\(s\) .* GiB beyond the params "
                                         r"\(tree 1152\.\d+, .*\), but [\d.]+ GiB is free"):
        dj.generate(target, drafter, [[1, 2, 3]], method="ddtree", budget=2 ** 20, max_new_tokens=4)


def test_a_cpu_hosts_free_memory_is_the_lower_of_meminfo_and_its_cgroup(monkeypatch):
    files = {"/proc/meminfo": "MemTotal: 100 kB\nMemAvailable:  8388608 kB\n",     # 8 GiB
             "/sys/fs/cgroup/memory.max": "6442450944\n", "/sys/fs/cgroup/memory.current": "2147483648\n"}

    def fake_open(path, *a, **k):
        if path not in files:
            raise FileNotFoundError(path)
        return io.StringIO(files[path])

    monkeypatch.setattr(memory, "open", fake_open, raising=False)
    cpu = jax.devices("cpu")[0]
    assert memory.free_bytes(cpu) == 4 * 2 ** 30            # cgroup: 6 GiB limit, 2 GiB used
    files["/sys/fs/cgroup/memory.max"] = "max\n"
    assert memory.free_bytes(cpu) == 8 * 2 ** 30            # no cgroup limit: MemAvailable
    del files["/proc/meminfo"], files["/sys/fs/cgroup/memory.max"]
    assert memory.free_bytes(cpu) is None                   # nothing known: no check
