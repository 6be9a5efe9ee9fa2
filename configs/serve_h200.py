"""The H200 serving sweep: 64 requests (held-out prompts, cycled) served by continuous batching
through 4 or 16 stream slots, ar / dflash / ddtree at budgets 32..128, temperature 0, 128 new
tokens, 4 engine steps per dispatch, tokens/s the median of 3 served runs per point (serving takes
no decode_loop). Compare with the static batches of configs/sweep_h200.py, where a batch runs until its
slowest stream is done.

    python experiments/speculative_sweep.py --config=configs/serve_h200.py
"""

import importlib.util
import os


def get_config():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sweep_h200.py")
    spec = importlib.util.spec_from_file_location("sweep_h200", path)
    base = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(base)
    c = base.get_config()
    c.methods = ("ar", "dflash", "ddtree")
    c.budgets = (32, 64, 128)
    c.streams = (4, 16)
    c.requests = 64
    c.stage_reps = 0
    c.out_dir = c.out_dir.replace("sweep_h200", "serve_h200")
    return c
