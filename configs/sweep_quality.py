"""Quality bar of the shipped pair (docs/shipped_pair.md): DFlash chain vs DDTree at
budget 64, temperature 0, all 20 held-out prompts as 20 streams of one run (acceptance does not
depend on the batching).

    python experiments/speculative_sweep.py --config=configs/sweep_quality.py
"""

from ddtree_jax.bench.sweep import load_config


def get_config():
    c = load_config("sweep_default")
    c.methods = ("ar", "dflash", "ddtree")
    c.budgets = (64,)
    c.streams = (20,)
    c.max_new_tokens = 64
    c.out_dir = c.out_dir.replace("sweep_default", "sweep_quality")
    return c
