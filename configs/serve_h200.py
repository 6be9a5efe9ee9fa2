"""The H200 serving sweep: 64 requests (held-out prompts, cycled) served by continuous batching
through 4 or 16 stream slots, ar / dflash / ddtree at budgets 32..128, temperature 0, 128 new
tokens, 4 engine steps per dispatch, tokens/s the median of 3 served runs per point (serving takes
no decode_loop). Compare with the static batches of configs/sweep_h200.py, where a batch runs until its
slowest stream is done.

    python experiments/speculative_sweep.py --config=configs/serve_h200.py
"""

from ddtree_jax.bench.sweep import load_config


def get_config():
    c = load_config("sweep_h200")
    c.methods = ("ar", "dflash", "ddtree")
    c.budgets = (32, 64, 128)
    c.streams = (4, 16)
    c.requests = 64
    c.stage_reps = 0
    c.out_dir = c.out_dir.replace("sweep_h200", "serve_h200")
    return c
