"""The multi-stream speculative decoding engine: `generate` with methods "ar", "dflash", "ddtree".

Per step, entirely on the device (one jitted function, state buffers donated):
  draft   the DFlash drafter reads [pending, MASK x (B-1)] against its context cache -> draft logits
          for depths 1..B-1;
  tree    "ddtree": the `budget` best prefixes (build_tree); "dflash": the greedy chain;
  verify  one target forward over [root + nodes] per stream, position = start + depth, ancestor-only
          visibility, tapping the drafter's layers;
  accept  the target's own choice at every node (greedy or sampled), the walk from the root
          (follow_tree), stop tokens and max_new_tokens;
  compact the accepted nodes' latent-cache entries move to contiguous slots and their taps join the
          drafter's context; rejected entries are dropped by the lengths.
Under `jax.set_mesh(mesh)` (ddtree_jax.sharding) the same step runs sharded and `shard_state` keeps
the state's layout from step to step. A decode runs either on the device (`_decode_on_device`: one
call, the device checks every few steps whether a stream has tokens left) or from the host
(`decode`: the host reads how many tokens each stream has left, a few steps behind the device
without making it wait, and stops dispatching once the steps in flight should finish every
stream; for ar without stop tokens it dispatches the known steps and reads nothing). Either way
the compiled call keeps its state in the same device buffers from decode to decode
(`CompiledDecode.load`), so XLA's CUDA graphs are replayed, not recorded again.
Stage times come from the same stage functions jitted one by one and timed on a copy of the
prefilled state. docs/engine.md explains the loops, the buffers and the measurements behind them.

Modules: `state` (Plan, EngineState, Setup, `setup`), `step` (the stages and the step),
`memory` (the memory check before a decode), `prefilling`, `loops` (device and host decode
loops, CompiledDecode), `generation` (generate); `serving` holds
continuous batching over the same step. Everything public is importable from here.
"""

from ddtree_jax.engine.generation import generate
from ddtree_jax.engine.loops import (DEVICE_LOOP_GRAPHS, CompiledDecode, compile_decode,
                                     decode, decode_loop_for, exact_steps, initial_left, run_decode,
                                     steps_to_finish)
from ddtree_jax.engine.memory import check_memory, step_bytes
from ddtree_jax.engine.prefilling import initial_state, prefill
from ddtree_jax.engine.state import (DECODE_LOOPS, METHODS, Decoding, EngineState, GenerateResult, Kernels,
                                     Plan, Setup, copy_tree, resolve_options, setup, shard_state)
from ddtree_jax.engine.step import (chain_tree, decode_steps, speculative_step, stage_accept,
                                    stage_draft, stage_times, stage_tree, stage_verify, tokens_left)

__all__ = ["DECODE_LOOPS", "DEVICE_LOOP_GRAPHS", "METHODS", "CompiledDecode", "Decoding", "EngineState",
           "GenerateResult", "Kernels", "Plan", "Setup", "chain_tree", "check_memory", "compile_decode", "copy_tree",
           "decode", "decode_loop_for", "decode_steps", "exact_steps", "generate", "initial_left",
           "initial_state", "prefill", "resolve_options", "run_decode", "setup", "shard_state", "speculative_step",
           "stage_accept", "stage_draft", "stage_times", "stage_tree", "stage_verify",
           "step_bytes", "steps_to_finish", "tokens_left"]
