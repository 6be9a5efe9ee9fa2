"""Default speculative sweep (`make run`): ar, dflash, ddtree at budgets 8/32/64 and ddtree-auto, at
1 and 4 streams, temperature 0, 32 new tokens, every held-out prompt, tokens/s the median of 3
timed decodes. Uses the shipped pair (assets/pair/target,
assets/pair/drafter, held-out prompts) when it exists, otherwise a random tiny pair.

    python experiments/speculative_sweep.py --config=configs/sweep_default.py
"""

import os

import ml_collections

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def get_config():
    c = ml_collections.ConfigDict()
    c.target_dir = os.path.join(REPO, "assets/pair/target")
    c.drafter_dir = os.path.join(REPO, "assets/pair/drafter")
    c.prompts = os.path.join(REPO, "assets/pair/heldout_prompts.json")
    c.dtype = "float32"          # parameter dtype of the loaded pair
    c.random_tiny = not (os.path.isdir(c.target_dir) and os.path.isdir(c.drafter_dir))
    c.random_vocab = 64          # random tiny pair only: vocabulary, drafter block, prompt length
    c.block_size = 16
    c.prompt_len = 0             # cut prompts to this many tokens (0: as given; random prompts: 32)
    c.methods = ("ar", "dflash", "ddtree", "ddtree-auto")   # also "ddtree-shared", "ddtree-shared-auto"
    c.budgets = (8, 32, 64)
    c.shared_budgets = ()        # ddtree-shared: draft nodes per step over all streams (and, with
                                 # "ddtree", each total's uniform split N / streams where it divides)
    c.shared_cap = 32            # ddtree-shared: the most nodes one stream may take
    c.streams = (1, 4)
    c.temperatures = (0.0,)
    c.top_k = 0
    c.top_p = 1.0
    c.max_new_tokens = 32
    c.batches = 0                # prompt batches per point, streams prompts each (0: every prompt)
    c.stage_reps = 3             # timed repetitions of each engine stage (0: no breakdown)
    c.timing_reps = 3            # timed decodes per prompt batch (tokens/s: median, lowest, highest)
    c.matmul_precision = "auto"  # "auto": "highest" (true float32) for a float32 pair, else JAX's default
    c.steps_per_call = 1         # engine steps per dispatch (a device loop when > 1)
    c.ar_steps_per_call = 0      # the ar baseline's steps per dispatch (0: steps_per_call)
    c.decode_loop = "auto"       # "host" / "device" / "auto" (engine.decode_loop_for)
    c.drafter_attn_impl = "auto"  # the drafter's attention: "auto" (by backend), "xla", "pallas_triton"
    c.attn_balance = True        # the target attention's hint for ragged contexts (False: equal-context schedule)
    c.requests = 0               # > 0: serve this many requests through `streams` slots (refilled)
    c.xla_flags = ""             # appended to XLA_FLAGS for this run (for example GPU graph settings)
    c.auto_steps = 4             # ddtree-auto: steps whose trees give the expected acceptance
    c.seed = 0
    c.compile_cache = os.path.join(REPO, "runs/jax_cache")   # persistent XLA cache ("": off)
    c.out_dir = os.path.join(REPO, "runs/sweep_default")
    c.results_dir = ""           # also write the finished sweep's record here (ddtree_jax.bench.record)
    return c
