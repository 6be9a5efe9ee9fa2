"""The engine's static plan, its device state, a validated call (`setup`) and its result."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from ddtree_jax import drafter as dft
from ddtree_jax import metrics
from ddtree_jax import model as tgt
from ddtree_jax import sharding
from ddtree_jax.budget import StepTimeCurve
from ddtree_jax.checks import check_int, integer_array, is_int
from ddtree_jax.config import DrafterConfig, Kernels, ModelConfig
from ddtree_jax.sampling import Sampling


METHODS = ("ar", "dflash", "ddtree")
DECODE_LOOPS = ("auto", "host", "device")


@flax.struct.dataclass
class EngineState:
    """Everything a step reads and writes, one row per stream (S streams)."""

    tcache: tgt.LatentCache      # committed tokens (all emitted tokens but the pending one)
    dcache: dft.DrafterCache | None
    pending: jnp.ndarray         # [S] int32 last emitted token, not yet through the target
    out_tokens: jnp.ndarray      # [S, max_new + block] int32 emitted tokens
    out_len: jnp.ndarray         # [S] int32
    accept: jnp.ndarray          # [S, max_steps] int32 acceptance length per step (0: inactive)
    nodes: jnp.ndarray           # [S, max_steps] int32 draft nodes verified per step (0: inactive)
    done: jnp.ndarray            # [S] bool
    max_new: jnp.ndarray         # [S] int32
    step: jnp.ndarray            # [] int32
    key: jnp.ndarray             # PRNG key


@dataclasses.dataclass(frozen=True)
class Plan:
    """Static description of one generate call (hashable: a jit static argument)."""

    tcfg: ModelConfig
    dcfg: DrafterConfig | None
    method: str
    budget: int
    sampling: Sampling
    stop_tokens: tuple[int, ...]
    kernels: Kernels = Kernels()   # the kernel implementations of the model, drafter and tree
    # "ddtree" only: None, each stream a tree of `budget` nodes; an int N, the N best nodes over
    # all active streams, at most `budget` each (tree.share_budget); a StepTimeCurve over shared
    # totals, N chosen per step by the expected rate (budget.shared_total)
    shared_budget: int | StepTimeCurve | None = None

    @property
    def nodes(self) -> int:
        """Verified token slots per stream per step (root included); with a shared budget, the
        slots past a stream's real nodes are padding that the routed experts skip."""
        return {"ar": 1, "dflash": self.dcfg.block_size if self.dcfg else 1,
                "ddtree": self.budget + 1}[self.method]

    @property
    def max_depth(self) -> int:
        return 0 if self.method == "ar" else self.dcfg.block_size - 1


@dataclasses.dataclass
class GenerateResult:
    """What `generate` (one entry per stream) or `serve` (one per request) returns; `metrics()`
    derives the acceptance and latency figures (ddtree_jax.metrics)."""

    tokens: list                 # per stream: generated ids
    acceptance_lengths: list     # per stream: tokens emitted by each step before truncation
    tau: float                   # mean acceptance length over all (stream, step) pairs
    tokens_per_second: float     # generated tokens / decode wall time (compile, warm-up excluded)
    stage_times: dict            # seconds per step: draft, tree, verify, accept (+ step total)
    steps: int
    prefill_seconds: float       # the prompts' prefill, which emits each stream's first token
    decode_seconds: float        # the median of decode_times
    compile_seconds: float       # the decode's compile and, with warmup, the prefill's first run
    request_seconds: list | None = None   # `serve` only: per request, admission to its result
    tree_nodes: list | None = None   # per stream: draft nodes verified by each step, as acceptance_lengths
    device_steps: int = 0        # steps the device ran, including those after every stream was done
    decode_loop: str = ""        # the loop that ran the decode: "host" or "device" (`decode_loop_for`)
    texts: list | None = None    # per stream: `tokens` decoded, where a tokenizer was given
    first_token_seconds: list | None = None  # per stream: start (compile excluded) to its first token
    last_token_seconds: list | None = None   # per stream: start (compile excluded) to its last token
    nodes_per_step: int = 1      # tokens the target verifies per stream per step (root included)
    max_accept_length: int = 1   # the most tokens one step emits: the drafter's block size (ar: 1)
    decode_times: list | None = None   # seconds of each timed decode (Decoding.timing_reps of them)

    def metrics(self) -> dict:
        """Mean accept length, acceptance rate by depth, acceptance histogram, accepted tokens
        per verified token, TTFT and TPOT (mean, p50, p90, p99) and tokens/s, as plain floats
        and lists (`ddtree_jax.metrics.summary`)."""
        verified = (self.nodes_per_step if self.tree_nodes is None
                    else [[n + 1 for n in row] for row in self.tree_nodes])
        return dict(metrics.summary(self.acceptance_lengths, self.max_accept_length, verified,
                                    self.tokens, self.first_token_seconds, self.last_token_seconds),
                    tokens_per_second=self.tokens_per_second)


@dataclasses.dataclass(frozen=True)
class Decoding:
    """How a decode runs and is timed; every choice yields the same tokens.

    steps_per_call: engine steps per dispatch of the compiled step, or between the device loop's
    checks for streams with tokens left; decode_loop: "auto", "host" or "device"
    (`loops.decode_loop_for`); max_lag: calls the host loop lets run ahead of its reads (None:
    max(1, 3 // steps_per_call)); timing_reps: decodes of the same prefilled state, tokens/s from
    the median; stage_reps: timed repetitions of each stage for `stage_times` (0: none); warmup:
    run the compiled call once before timing, so first-run costs stay out of tokens/s.
    """

    steps_per_call: int = 1
    decode_loop: str = "auto"
    max_lag: int | None = None
    timing_reps: int = 1
    stage_reps: int = 3
    warmup: bool = True

    def __post_init__(self):
        check_int("steps_per_call", self.steps_per_call, 1)
        check_int("timing_reps", self.timing_reps, 1)
        check_int("stage_reps", self.stage_reps, 0)
        if self.max_lag is not None:
            check_int("max_lag", self.max_lag, 1)
        if self.decode_loop not in DECODE_LOOPS:
            raise ValueError(f"decode_loop must be one of {DECODE_LOOPS}, got {self.decode_loop!r}")
        if not isinstance(self.warmup, bool):
            raise ValueError(f"warmup must be a bool, got {self.warmup!r}")

    @property
    def lag(self) -> int:
        """The host loop's lag in calls (max_lag, or `default_lag`)."""
        return default_lag(self.steps_per_call) if self.max_lag is None else self.max_lag


def default_lag(steps_per_call: int) -> int:
    """Calls the host loop lets run ahead of its reads by default: about 3 steps' worth, at least 1."""
    return max(1, 3 // steps_per_call)


SAMPLING_FIELDS = ("temperature", "top_k", "top_p")


def resolve_options(sampling: Sampling | None = None, kernels: Kernels | None = None,
                    decoding: Decoding | None = None, **aliases) -> tuple[Sampling, Kernels, Decoding]:
    """The three option values of a call, each from its own argument (None: the default) with the
    keyword aliases that name one field (temperature=..., attn_impl=..., steps_per_call=...)
    replaced; TypeError naming any keyword that is none of them."""
    groups = {"sampling": {}, "kernels": {}, "decoding": {}}
    decoding_fields = {f.name for f in dataclasses.fields(Decoding)}
    for key, value in aliases.items():
        group = ("sampling" if key in SAMPLING_FIELDS else "kernels" if key in Kernels.ALIASES
                 else "decoding" if key in decoding_fields else None)
        if group is None:
            raise TypeError(f"unknown option {key!r}: expected one of {sorted(SAMPLING_FIELDS)}, "
                            f"{sorted(Kernels.ALIASES)} or {sorted(decoding_fields)}")
        groups[group][key] = value
    for name, value, kind in (("sampling", sampling, Sampling), ("decoding", decoding, Decoding)):
        if value is not None and not isinstance(value, kind):
            raise TypeError(f"{name} must be a {kind.__name__}; got {type(value).__name__}")
    return (dataclasses.replace(sampling or Sampling(), **groups["sampling"]),
            Kernels.of(kernels, **groups["kernels"]),
            dataclasses.replace(decoding or Decoding(), **groups["decoding"]))


def shard_state(state: EngineState) -> EngineState:
    """Pin the state's layout under a mesh (streams over "data", caches by their rules), so every
    step returns the state laid out as it took it; the identity without a mesh."""
    streams = lambda x: sharding.constrain(x, ("streams",) + (None,) * (x.ndim - 1))
    tcache = tgt.LatentCache(kv=tuple(sharding.constrain(k, sharding.LATENT_CACHE)
                                      for k in state.tcache.kv),
                             lengths=streams(state.tcache.lengths))
    dcache = state.dcache
    if dcache is not None:
        dcache = dft.DrafterCache(*(sharding.constrain(c, sharding.DRAFTER_CACHE) for c in dcache[:2]),
                                  streams(dcache.lengths))
    return state.replace(tcache=tcache, dcache=dcache, pending=streams(state.pending),
                         out_tokens=streams(state.out_tokens), out_len=streams(state.out_len),
                         accept=streams(state.accept), nodes=streams(state.nodes),
                         done=streams(state.done), max_new=streams(state.max_new))


@dataclasses.dataclass(frozen=True)
class Setup:
    """A validated generate call: the static plan and the host-side padded inputs."""

    plan: Plan
    prompts: np.ndarray      # [S, P] int32, zero-padded
    lengths: np.ndarray      # [S] int32
    max_new: np.ndarray      # [S] int32
    max_len: int             # target cache slots per stream
    max_out: int             # output buffer width
    max_steps: int


def _check_pair(name: str, pair, config_type) -> None:
    """ValueError naming `name` unless `pair` is a (config_type, params dict) pair."""
    if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and isinstance(pair[0], config_type)
            and isinstance(pair[1], Mapping)):
        got = (f"a {type(pair).__name__} of {len(pair)}" if isinstance(pair, (tuple, list))
               else type(pair).__name__)
        raise ValueError(f"{name} must be a ({config_type.__name__}, params) pair, as "
                         f"load_{name} returns; got {got}")


def encode_prompts(prompts, tokenizer=None) -> list:
    """The prompts as token lists: each str through `tokenizer.encode`, token lists as they are.
    ValueError naming the prompt for text without a tokenizer or text of no tokens, and for one
    str in place of a list of prompts."""
    if isinstance(prompts, str):
        raise ValueError("prompts must be a list of prompts (strings or token-id lists); got one "
                         "str: pass [text]")
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            if tokenizer is None:
                raise ValueError(f"prompts[{i}] is text: pass tokenizer= (ddtree_jax.Tokenizer) to encode it")
            p = tokenizer.encode(p)
            if not p:
                raise ValueError(f"prompts[{i}] is text that encodes to no tokens")
        out.append(p)
    return out


def setup(target, drafter, prompts, *, method="ddtree", budget=64, shared_budget=None,
          max_new_tokens=64, sampling: Sampling | None = None, stop_tokens=(), max_len=None,
          kernels: Kernels | None = None, tokenizer=None, **aliases) -> Setup:
    """Validate a generate call (see `generate`) and lay out its inputs. sampling, kernels and
    their keyword aliases (temperature=..., attn_impl=...) as `resolve_options` takes them; text
    prompts through `tokenizer` (`encode_prompts`)."""
    sampling, kernels, _ = resolve_options(sampling, kernels, **aliases)
    prompts = encode_prompts(prompts, tokenizer)
    _check_pair("target", target, ModelConfig)
    tcfg = target[0]
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    dcfg = None
    if method != "ar":
        if drafter is None:
            raise ValueError(f"method {method!r} needs a drafter (config, params)")
        _check_pair("drafter", drafter, DrafterConfig)
        dcfg = drafter[0]
        dcfg.check_target(tcfg)
    if method == "ddtree":
        check_int("budget", budget, 1)
    shared_budget = _shared_budget(shared_budget, method)
    stop = _stop_tokens(stop_tokens)
    if any(not 0 <= t < tcfg.vocab_size for t in stop):
        raise ValueError(f"stop_tokens must lie in the vocabulary [0, {tcfg.vocab_size}); got "
                         f"{[t for t in stop if not 0 <= t < tcfg.vocab_size]}")
    plan = Plan(tcfg, dcfg, method, int(budget) if method == "ddtree" else 0, sampling, stop, kernels,
                shared_budget)
    lengths = np.array([len(p) for p in prompts], np.int32)
    if len(prompts) == 0 or np.any(lengths == 0):
        raise ValueError("prompts must be a non-empty list of non-empty token lists")
    max_new = integer_array("max_new_tokens", max_new_tokens)
    if max_new.shape not in ((), lengths.shape):
        raise ValueError(f"max_new_tokens must be one int or one per prompt ({len(prompts)}), "
                         f"got shape {max_new.shape}")
    max_new = np.broadcast_to(max_new, lengths.shape).astype(np.int32)
    if np.any(max_new < 1):
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new.tolist()}")
    padded = np.zeros((len(prompts), lengths.max()), np.int32)
    for i, p in enumerate(prompts):
        p = integer_array(f"prompts[{i}]", p)
        if p.ndim != 1:
            raise ValueError(f"prompts[{i}] must be a list of token ids, got shape {p.shape}")
        padded[i, :len(p)] = p
    if padded.min() < 0 or padded.max() >= tcfg.vocab_size:
        raise ValueError(f"prompt token ids must lie in [0, {tcfg.vocab_size})")
    needed = int((lengths + max_new).max()) + plan.nodes
    if max_len is None:
        max_len = tgt.aligned_slots(needed)
    elif needed > max_len:
        raise ValueError(f"prompts longer than the cache: longest prompt + max_new_tokens + "
                         f"{plan.nodes} verify slots = {needed} > max_len = {max_len}")
    if int((lengths + max_new).max()) > tcfg.max_position_embeddings:
        raise ValueError(f"prompt + max_new_tokens exceeds max_position_embeddings "
                         f"{tcfg.max_position_embeddings}")
    return Setup(plan, padded, lengths, max_new, max_len,
                 max_out=int(max_new.max()) + plan.max_depth + 1, max_steps=int(max_new.max()))


def _shared_budget(shared_budget, method: str) -> int | StepTimeCurve | None:
    """setup's shared_budget: None, an int >= 0 or a StepTimeCurve, for method "ddtree" only."""
    if not (shared_budget is None or isinstance(shared_budget, StepTimeCurve)
            or is_int(shared_budget) and shared_budget >= 0):
        raise ValueError(f"shared_budget must be None, an int >= 0 or a budget.StepTimeCurve, got "
                         f"{shared_budget!r}")
    if shared_budget is not None and method != "ddtree":
        raise ValueError(f"shared_budget is a total of tree nodes: it needs method 'ddtree', not "
                         f"{method!r}")
    return int(shared_budget) if is_int(shared_budget) else shared_budget


def _stop_tokens(stop_tokens) -> tuple[int, ...]:
    """One token id or a sequence of them -> a tuple of ints."""
    stop = np.asarray(stop_tokens)
    if stop.size == 0:
        return ()
    stop = integer_array("stop_tokens", stop)
    if stop.ndim > 1:
        raise ValueError(f"stop_tokens must be one token id or a list of them, got shape {stop.shape}")
    return tuple(int(t) for t in stop.reshape(-1))


def copy_tree(tree):
    """A copy of every array in `tree` (a state, a cache): new buffers, same shapes and layout."""
    return jax.tree_util.tree_map(jnp.copy, tree)
