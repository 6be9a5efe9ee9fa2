"""The decode loops: one device call per decode (`_decode_on_device`) or a host loop of
`decode_steps` calls (`decode`), and the compiled call that keeps its buffers (`CompiledDecode`)."""

from __future__ import annotations

import collections
import functools

import jax
import jax.numpy as jnp
import numpy as np

from ddtree_jax.engine.state import DECODE_LOOPS, EngineState, Plan, Setup, copy_tree, default_lag
from ddtree_jax.engine.step import _step_and_flag, decode_steps, tokens_left




def _decode_on_device(tparams, dparams, state: EngineState, plan: Plan, steps: int, max_iters: int):
    """A whole decode as one call -> the final state: `steps`-step loops (as `decode_steps`)
    repeated while some stream has tokens left, at most `max_iters` times. The device checks the
    counts itself every `steps` steps, so there is one dispatch per decode and at most `steps` - 1
    steps run after the last stream is done; each check is a data-dependent loop condition, which
    XLA reads back on the host unless while loops are recorded into CUDA graphs."""
    def more(carry):
        s, i = carry
        return (i < max_iters) & jnp.any(tokens_left(s) > 0)

    def body(carry):
        s, i = carry
        return _step_and_flag(tparams, dparams, s, plan, steps)[0], i + 1

    state, _ = jax.lax.while_loop(more, body, (state, jnp.zeros((), jnp.int32)))
    return state


_decode_all = jax.jit(_decode_on_device, static_argnames=("plan", "steps", "max_iters"),
                      donate_argnames=("state",))


def decode_loop_for(plan: Plan, decode_loop: str = "auto") -> str:
    """The decode loop a generate call runs: "host" (the host dispatches `steps_per_call`-step
    calls of `decode_steps`: `decode`) or "device" (one call of `_decode_on_device` runs the whole
    decode, checking every `steps_per_call` steps whether a stream has tokens left). "auto": "host" for ar
    without stop tokens, whose step count is known before it starts (the host dispatches exactly
    those calls and reads nothing), "device" otherwise. A host read of a device array can cost
    more than half a small model's ar step (docs/engine.md, "What the host costs")."""
    if decode_loop not in DECODE_LOOPS:
        raise ValueError(f"decode_loop must be one of {DECODE_LOOPS}, got {decode_loop!r}")
    if decode_loop == "auto":
        return "host" if _steps_known(plan) else "device"
    return decode_loop


def initial_left(su: Setup) -> np.ndarray:
    """[S] tokens each stream may emit after the prefill's first token, from the host's own
    inputs (no device read): max_new - 1. A stream whose first token is a stop token is done
    already, which only the device knows; this counts it as active."""
    return (su.max_new - 1).astype(np.int32)


def _steps_known(plan: Plan) -> bool:
    """Whether the steps a decode needs are known before it starts: ar without stop tokens emits
    exactly one token per step."""
    return plan.method == "ar" and not plan.stop_tokens


def exact_steps(plan: Plan, left0: np.ndarray) -> int | None:
    """The steps that finish every stream, when known before the decode starts (`_steps_known`:
    the most tokens any stream has left), else None."""
    return int(np.max(left0, initial=0)) if _steps_known(plan) else None



# XLA options the device loop's executable is compiled with: its while loop and conditionals are
# recorded into CUDA graphs as well (XLA's default records fusions, library calls and custom calls,
# and drives a while loop from the host, which reads the loop's condition every iteration), and
# graphs of any size are kept. Flags of XLA's GPU backend; other backends accept and ignore them.
# They make the device loop's decode faster and ar's host-loop step slower, so only the device
# loop is compiled with them (docs/engine.md, "DEVICE_LOOP_GRAPHS").
DEVICE_LOOP_GRAPHS = {
    "xla_gpu_enable_command_buffer": "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,DYNAMIC_SLICE_FUSION,"
                                     "WHILE,CONDITIONAL",
    "xla_gpu_graph_min_graph_size": 1,
}


@functools.partial(jax.jit, donate_argnums=0)
def _place(buffers: EngineState, state: EngineState) -> EngineState:
    """`state` copied into `buffers` (donated): the result lives at `buffers`' addresses."""
    return jax.tree_util.tree_map(lambda b, x: b.at[...].set(x), buffers, state)


class CompiledDecode:
    """The compiled call one decode dispatches (`compile_decode`), with device buffers that stay
    the same from decode to decode.

    XLA records CUDA graphs against buffer addresses and records them again when an argument
    lives somewhere new, which costs host time at the start of a decode while the device idles
    (docs/engine.md, "CUDA graphs and stable buffers"). So the next decode's state goes into the
    buffers the last call returned: `prefill(..., into=call)` writes it there, or `load(state)`
    copies a prefilled state there (one small donated copy, `_place`; for decoding one prefilled
    state several times), and the call runs the graphs as recorded. The state a call returns
    stays valid until the next `load` or `prefill(..., into=)`, which reuse its buffers.
    """

    def __init__(self, executable):
        self.executable = executable
        self._buffers = None   # the state the last call returned

    def buffers(self, like: EngineState | None = None) -> EngineState | None:
        """The state the last call returned, if it is still alive (and laid out as `like`: under
        a mesh the step may return the drafter cache sharded otherwise than the prefill)."""
        last = self._buffers
        if last is None or any(b.is_deleted() for b in jax.tree_util.tree_leaves(last)):
            return None
        if like is not None and any(b.sharding != x.sharding for b, x in zip(
                jax.tree_util.tree_leaves(last), jax.tree_util.tree_leaves(like))):
            return None
        return last

    def load(self, state: EngineState) -> EngineState:
        """`state` (not consumed) in this call's buffers, for the next call to run on; a plain
        copy where there are none (before the first call, or laid out otherwise)."""
        last = self.buffers(like=state)
        return copy_tree(state) if last is None else _place(last, state)

    def __call__(self, tparams, dparams, state: EngineState):
        out = self.executable(tparams, dparams, state)
        self._buffers = out[0] if isinstance(out, tuple) else out
        return out


def compile_decode(tparams, dparams, state: EngineState, su: Setup, steps_per_call: int,
                   loop: str, device_graphs: bool = True) -> CompiledDecode:
    """The compiled call that one decode of `loop` dispatches: "device", state -> final state;
    "host", state -> (state, left) per `steps_per_call` steps. The device loop is compiled with
    `DEVICE_LOOP_GRAPHS` unless device_graphs=False (XLA's defaults)."""
    if loop == "device":
        lowered = _decode_all.lower(tparams, dparams, state, su.plan, steps_per_call,
                                    -(-su.max_steps // steps_per_call))
        return CompiledDecode(lowered.compile(
            compiler_options=DEVICE_LOOP_GRAPHS if device_graphs else None))
    return CompiledDecode(decode_steps.lower(tparams, dparams, state, su.plan, steps_per_call).compile())


def run_decode(call, tparams, dparams, state: EngineState, su: Setup, steps_per_call: int,
               loop: str, pace: bool | None = None, max_lag: int | None = None) -> EngineState:
    """One decode from the prefilled `state` with `call` (compile_decode's), as `generate` runs
    it: "device", the one call; "host", `decode`, told the counts before the first step and, for
    ar without stop tokens, the exact steps, so it reads no device array at all. pace: None paces
    only with several steps per call (see `decode`); max_lag: None, `default_lag`."""
    if loop == "device":
        return call(tparams, dparams, state)
    left0 = initial_left(su)
    return decode(call, tparams, dparams, state, -(-su.max_steps // steps_per_call),
                  max_lag=default_lag(steps_per_call) if max_lag is None else max_lag,
                  steps_per_call=steps_per_call,
                  pace=steps_per_call > 1 if pace is None else pace, left0=left0,
                  known_steps=exact_steps(su.plan, left0))


def decode(step, tparams, dparams, state: EngineState, max_calls: int, max_lag: int = 3,
           steps_per_call: int = 1, pace: bool = True, left0: np.ndarray | None = None,
           known_steps: int | None = None) -> EngineState:
    """The host loop: call `step` (a compiled `decode_steps` of `steps_per_call` steps) until every
    stream is done or `max_calls` calls.

    Each call's `left` counts start their copy to the host when the call is dispatched; the host
    reads them once the device has produced them and blocks only while `max_lag` of them are
    outstanding, so the device never waits for the host's round trip (which can cost more than
    half a small model's step). Calls dispatched after the last useful one
    would still cost device time, so once counts have arrived the host paces itself: it
    dispatches another call only while `steps_to_finish` predicts more steps than those already
    in flight, and otherwise waits for the next counts (ar's prediction is exact; a speculative
    one that proves short costs the device one host round trip). pace=False: dispatch up to
    `max_lag` calls ahead to the end, as for an unknown finish; `generate` paces only with several
    steps per call: with one, the host's dispatch already sets the pace and the prediction's own
    host time would slow the decode (docs/engine.md, "Steps per call").
    left0 [S]: tokens each stream has left before the first step, if the caller knows them
    (otherwise three device reads). known_steps: the steps that finish
    every stream, if known before the start (ar without stop tokens): the calls that run them are
    dispatched and no counts are read.
    """
    if left0 is None:
        left0 = np.where(np.asarray(state.done), 0, np.asarray(state.max_new) - np.asarray(state.out_len))
    if not left0.any():
        return state
    if known_steps is not None:
        for _ in range(min(max_calls, -(-known_steps // steps_per_call))):
            state, _ = step(tparams, dparams, state)
        return state
    pending = collections.deque()       # `left` of dispatched calls not yet read, oldest first
    read, left = 0, left0               # calls whose counts were read; the latest counts

    def more_needed() -> bool:
        ahead = len(pending) * steps_per_call
        return not pace or read == 0 or steps_to_finish(left0, left, read * steps_per_call) > ahead

    for _ in range(max_calls):
        while pending and not more_needed():   # the calls in flight should finish: wait for them
            left, read = np.asarray(pending.popleft()), read + 1
            if not left.any():
                return state
        state, out = step(tparams, dparams, state)
        out.copy_to_host_async()
        pending.append(out)
        while pending and (len(pending) > max_lag or pending[0].is_ready()):
            left, read = np.asarray(pending.popleft()), read + 1
            if not left.any():
                return state
    return state


def steps_to_finish(left0: np.ndarray, left: np.ndarray, steps: int) -> float:
    """Predicted steps until every stream is done: each active stream's tokens left over its own
    tokens per step so far (at least 1), the largest. left0, left [S]: tokens left before the
    first step and after `steps` steps."""
    active = left > 0
    if not active.any():
        return 0.0
    rate = np.maximum((left0 - left)[active] / max(steps, 1), 1.0)
    return float(np.max(left[active] / rate))
