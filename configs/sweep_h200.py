"""The H200 sweep: budgets 16..256 x streams 1/4/16 at temperature 0, held-out prompts, bf16 pair,
128 new tokens, tokens/s from the median of 3 decodes. The speculative methods decode as one device
call that checks every 4 steps for streams with tokens left; ar dispatches its known 8-step calls
from the host and reads nothing (decode_loop "auto", session 11). 24 points;
about 20 s each on an H200 (compiles and stage times included), so one device call of 10 minutes
holds it. Add temperatures or budgets with --config.key=value, GPU graph settings with
--config.xla_flags. The device loop's executable already records its while loop and conditionals
into CUDA graphs (`engine.DEVICE_LOOP_GRAPHS`, session 16: 1.09-1.13x on the all-prompts 1-stream
ddtree decode); BENCHMARKS.md's "GRAPHS_ALL", the same settings for every executable, is

    --config.xla_flags="--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,\
DYNAMIC_SLICE_FUSION,WHILE,CONDITIONAL --xla_gpu_graph_min_graph_size=1"

and `--config.xla_flags=--xla_gpu_command_buffer_update_mode=SKIP_TEMP` made the all-prompts 1-stream
decodes 5-9% (ddtree) and 2.5% (ar) faster, with no change at 4 and 16 streams (BENCHMARKS.md,
session 10).

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
    c.budgets = (16, 32, 64, 128, 256)
    c.streams = (1, 4, 16)
    c.temperatures = (0.0,)
    c.max_new_tokens = 128
    c.batches = 1
    c.stage_reps = 3
    c.timing_reps = 3
    c.steps_per_call = 4        # steps per device-loop check (1 stream: 2 is ~5% faster, 4 and 16
                                # streams: 4 is 2-5% faster; BENCHMARKS.md session 11)
    c.ar_steps_per_call = 8     # ar at its best k (session 3); at 4 steps per call it measured ~20%
                                # slower at 4-16 streams, which inflated speedups (session 10)
    c.out_dir = c.out_dir.replace("sweep_default", "sweep_h200")
    return c
