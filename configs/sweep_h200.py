"""The H200 sweep: budgets 16..256 x streams 1/4/16 at temperature 0, every held-out prompt at
every stream count (at 1 stream a point decodes the 20 prompts one after another), bf16 pair, 128
new tokens, tokens/s from the median of 3 decodes (with the lowest and highest). The speculative
methods decode as one device call that checks every 4 steps for streams with tokens left; ar
dispatches its known 8-step calls from the host and reads nothing (decode_loop "auto":
engine.decode_loop_for). Add temperatures or budgets with
--config.key=value, GPU graph settings with --config.xla_flags. The device loop's executable
already records its while loop and conditionals into CUDA graphs (`engine.DEVICE_LOOP_GRAPHS`);
the same settings for every executable ("GRAPHS_ALL" in docs/engine.md, "DEVICE_LOOP_GRAPHS") are

    --config.xla_flags="--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,\
DYNAMIC_SLICE_FUSION,WHILE,CONDITIONAL --xla_gpu_graph_min_graph_size=1"

and `--config.xla_flags=--xla_gpu_command_buffer_update_mode=SKIP_TEMP` speeds up 1-stream decodes
through the host loop and leaves 4 and 16 streams and the device loop unchanged (docs/engine.md,
"DEVICE_LOOP_GRAPHS").

    python experiments/speculative_sweep.py --config=configs/sweep_h200.py
"""

import os

from ddtree_jax.bench.sweep import load_config


def get_config():
    c = load_config("sweep_default")
    c.dtype = "bfloat16"
    c.budgets = (16, 32, 64, 128, 256)
    c.streams = (1, 4, 16)
    c.temperatures = (0.0,)
    c.max_new_tokens = 128
    c.batches = 0                # every held-out prompt
    c.stage_reps = 3
    c.timing_reps = 3
    c.steps_per_call = 4        # steps per device-loop check (the fastest at 4 and 16 streams; at 1
                                # stream 2 is slightly faster: docs/engine.md, "Steps per call")
    c.ar_steps_per_call = 8     # ar at its fastest steps per call, so that a slow baseline does not
                                # inflate the speedups (docs/engine.md, "Steps per call")
    c.out_dir = c.out_dir.replace("sweep_default", "sweep_h200")
    c.results_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")
    return c
