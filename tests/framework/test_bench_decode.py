"""ddtree_jax/bench/decode.py (experiments/decode_timeline.py's support): its points and prompt
batches, and one point's loops on a random tiny pair on the CPU."""

import jax
import pytest

import ddtree_jax as dj
from ddtree_jax.bench import decode


def test_decode_timeline_points_are_checked():
    assert decode.parse_point("ddtree:64:16:4") == ("ddtree", 64, 16, 4)
    for bad in ("ddtree:64:16", "beam:4:1:1", "ddtree:0:1:1", "ar:0:1:0", "ar:x:1:1"):
        with pytest.raises(ValueError, match="--points"):
            decode.parse_point(bad)
    prompts = [[1], [2], [3]]
    assert decode.prompt_batches(prompts, 1, 3) == [[[1]], [[2]], [[3]]]
    assert decode.prompt_batches(prompts, 2, 2) == [[[1], [2]], [[3], [1]]]


def test_decode_timeline_point_on_a_tiny_pair():
    """An ar point and a ddtree point, each with the paced host loop and the device loop: the loops
    agree on the tokens (and ddtree's are ar's) before timing; each loop gets a wall time and its
    steps; graph_launches asks for no more than the CPU's trace holds (no device kernels)."""
    tcfg = dj.ModelConfig.preset("tiny").replace(vocab_size=16)
    dcfg = dj.DrafterConfig.for_target(tcfg, block_size=3)
    target = (tcfg, dj.init_target(tcfg, jax.random.key(0)))
    drafter = (dcfg, dj.init_drafter(dcfg, jax.random.key(1)))
    prompts, greedy = [[1, 2, 3, 4, 5], [6, 7, 8, 9]], {}
    kw = dict(loops=("paced", "device"), num_batches=2, max_new_tokens=4, reps=1, graph_launches=True)
    ar = decode.run_point(target, drafter, prompts, "ar", 0, 1, 2, greedy, **kw)
    assert set(greedy) == {1} and len(greedy[1]) == 2            # ar's tokens, per batch
    rec = decode.run_point(target, drafter, prompts, "ddtree", 2, 1, 2, greedy, **kw)
    for r in (ar, rec):
        assert r["batches"] == 2 and r["tokens"] == ar["tokens"] > 0 and r["tau"] >= 1
        for loop in ("paced", "device"):
            assert r[loop]["wall_ms"] > 0 and r[loop]["device_steps"] >= 1 and "graph_launches" not in r[loop]
