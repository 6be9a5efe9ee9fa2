"""Shared against uniform verify budgets at equal total draft nodes per step, on the shipped pair:
at 4 and 16 streams and N = 16, 32, 64, 128 draft nodes per step, ddtree with N / streams nodes
per stream (uniform) against ddtree-shared with the N best nodes over all streams, at most 32 per
stream, and ddtree-shared-auto (N picked per step from the shared points' step times). All 20
held-out prompts: 5 batches of 4 streams, or 5 batches of 16 (each prompt 4 times); 32 new
tokens, float32, greedy (every point's tokens checked against ar's). Writes
runs/sweep_shared/results.jsonl with sweep_T0.png and shared_T0.png beside it; about 10 minutes
on 2 CPU cores, mostly compilation.

    python experiments/speculative_sweep.py --config=configs/sweep_shared.py
"""

from ddtree_jax.bench.sweep import load_config


def get_config():
    c = load_config("sweep_default")
    c.methods = ("ar", "ddtree", "ddtree-shared", "ddtree-shared-auto")
    c.budgets = ()                 # the uniform points are the shared budgets' splits
    c.shared_budgets = (16, 32, 64, 128)
    c.shared_cap = 32
    c.streams = (4, 16)
    c.batches = 5
    c.max_new_tokens = 32
    c.stage_reps = 3               # the "step" time of each point: the shared-auto point's curve
    c.out_dir = c.out_dir.replace("sweep_default", "sweep_shared")
    return c
