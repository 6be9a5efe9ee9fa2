"""The GPU sweep: budgets 4..1024 x streams 1..16 x temperatures 0 and 1, held-out prompts, bf16 pair.

    python experiments/speculative_sweep.py --config=configs/sweep_h200.py
"""

import importlib.util
import os


def get_config():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sweep_default.py")
    spec = importlib.util.spec_from_file_location("sweep_default", path)
    default = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(default)
    c = default.get_config()
    c.dtype = "bfloat16"
    c.budgets = (4, 16, 32, 64, 128, 256, 512, 1024)
    c.streams = (1, 4, 16)
    c.temperatures = (0.0, 1.0)
    c.max_new_tokens = 128
    c.batches = 2
    c.stage_reps = 5
    c.out_dir = c.out_dir.replace("sweep_default", "sweep_h200")
    return c
