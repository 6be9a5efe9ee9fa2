"""Roofline model of one Kimi K2.6 DDTree step (draft + tree + verify) on a node of GPUs.

A verify step carries T = streams x (budget + 1) tokens through 61 layers. Each part of the step costs
max(bytes / (memory bandwidth x efficiency), FLOPs / (matmul rate x efficiency)) (+ a latency floor);
the parts run one after another. Throughput = streams x tau(budget) / step time.

Assumptions (MODEL_ASSUMPTIONS is printed with every projection):
- Parallelism over G GPUs (8): routed experts expert-parallel (E/G experts per GPU, routing uniform
  and balanced, so a GPU carries T k / G token-expert pairs and E_act(T) / G active experts, with
  E_act(T) = E (1 - (1 - k/E)^T)); attention heads, MLA up-projections (q_b, kv_b, o), the shared
  expert, the dense layer-0 MLP, lm_head and the drafter tensor-parallel over G; q_a / kv_a
  projections and the router replicated; the MLA latent cache replicated (one latent KV head), so
  every GPU reads all of it for its H/G heads.
- Routed experts INT4 + bf16 group-32 scales (0.5625 B per weight); everything else bf16.
- Two ring all-reduces of the bf16 [T, d] activations per layer (after o_proj, after the MoE
  combine): 2 (G-1)/G x bytes / (link bandwidth x efficiency) + a latency each.
- Attention in the absorbed form: FLOPs 2 S Q (H/G) (ctx + Q) (kv_lora + rope + kv_lora); bytes =
  the latent cache S (ctx + Q) (kv_lora + rope) x 2 B; time = a fixed cost per call + its roofline
  floor / efficiency, the FLOPs over each stream's Q (H/G) rows rounded up to the kernel's blocks of
  64 (at 8 heads per GPU, Q = budget + 1 pads: 17 x 8 = 136 rows compute as 192, so the budgets
  include 2^k - 1 beside 2^k).
- Per step besides the layers: lm_head over T tokens; the drafter (its layers' weights once, plus
  lm_head over streams x (block - 1) draft positions); the tree build (H200 measurement, scaled by
  copy bandwidth for other GPUs); a fixed step overhead (accept, compaction, host loop).
- Every layer is as slow as the mean GPU (no expert load imbalance, no stragglers), compute and
  communication do not overlap, the context per stream is fixed over the run.
GPU numbers are datasheet leads except the H200 measurements (copy 4.27 TB/s, bf16 matmul 700
TFLOP/s, as the benchmark records in results/ measure them); other GPUs' effective rates keep the
H200's measured/datasheet ratios (copy 0.89 of HBM, matmul 0.71 of dense bf16).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ddtree_jax.config import DrafterConfig, ModelConfig

MODEL_ASSUMPTIONS = __doc__[__doc__.index("Assumptions"):].strip()

INT4_BYTES = 0.5 + 2 / 32          # per routed-expert weight: a nibble + a bf16 scale per 32
BF16 = 2
_COPY_RATIO = 4.27 / 4.8           # H200: measured copy / datasheet HBM
_MM_RATIO = 700 / 989              # H200: measured bf16 matmul / datasheet dense bf16


@dataclasses.dataclass(frozen=True)
class GPU:
    """Per-GPU rates: memory (TB/s), dense bf16 matmul (TFLOP/s), interconnect per direction (GB/s)."""

    name: str
    hbm_tbs: float                 # datasheet
    copy_tbs: float                # achievable device-to-device copy
    bf16_tflops: float             # achievable dense bf16 matmul
    link_gbs: float                # per direction, per GPU
    link: str
    link_latency_us: float         # per all-reduce
    source: str


def _gpu(name, hbm, bf16, link_gbs, link, latency, source, copy=None, mm=None) -> GPU:
    return GPU(name, hbm, copy or hbm * _COPY_RATIO, mm or bf16 * _MM_RATIO, link_gbs, link, latency,
               source)


GPUS = {
    "H200": _gpu("H200", 4.8, 989, 450, "NVLink 4", 10, "measured copy 4.27 TB/s and matmul 700 "
                 "TFLOP/s; HBM 4.8 TB/s, NVLink 450 GB/s/direction datasheet", copy=4.27, mm=700),
    "B300": _gpu("B300", 8.0, 2250, 900, "NVLink 5", 10, "datasheet leads: HBM3e 8 TB/s, dense bf16 "
                 "~2.25 PFLOP/s, NVLink 5 900 GB/s/direction"),
    "RTX PRO 6000": _gpu("RTX PRO 6000", 1.8, 500, 64, "PCIe 5 x16", 25, "datasheet leads: GDDR7 "
                         "1.8 TB/s, dense bf16 ~500 TFLOP/s, PCIe 5 x16 64 GB/s/direction"),
}


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Achieved fractions of the roofline per kind of work, and latency floors (microseconds).
    The calibrations the projection uses are read from the benchmark records
    (ddtree_jax.bench.calibration)."""

    name: str
    moe_bw_eff: float              # INT4 grouped GEMM: fraction of copy bandwidth
    moe_mm_eff: float              # ... fraction of the bf16 matmul rate when compute-bound
    moe_min_us: float              # ... per-layer kernel latency floor
    attn_eff: float                # MLA attention: fraction of its floor reached by the work itself
    attn_fixed_us: float           # ... fixed cost per call (launch, prep, split merge), added
    attn_rows: int                 # ... (node, head) rows per program: a stream's Q x H rows in whole blocks
    dense_bw_eff: float            # bf16 weight GEMMs: fraction of copy bandwidth
    dense_mm_eff: float
    comm_eff: float                # all-reduce: fraction of link bandwidth
    layer_us: float                # norms, rope, router, cache writes ... per layer
    step_us: float                 # accept, compaction, host loop per step
    tree_us: tuple                 # build_tree on the H200: ((budget, us), ...), log-interpolated
    source: str


# every efficiency 1 and no latency floors: the bare roofline
UNIT = Calibration("roofline", moe_bw_eff=1, moe_mm_eff=1, moe_min_us=0, attn_eff=1, attn_fixed_us=0, attn_rows=1,
                   dense_bw_eff=1, dense_mm_eff=1, comm_eff=1, layer_us=0, step_us=0, tree_us=((1, 0.0),),
                   source="bare roofline (all efficiencies 1, no latencies, no tree build)")

@dataclasses.dataclass(frozen=True)
class Deployment:
    model: ModelConfig
    drafter: DrafterConfig
    gpus: int = 8
    ctx: int = 4096                # context tokens per stream

    @classmethod
    def kimi_k2_6(cls, gpus: int = 8, ctx: int = 4096) -> "Deployment":
        model = ModelConfig.preset("kimi_k2_6")
        return cls(model, DrafterConfig.for_target(model), gpus, ctx)


def _roof(byts: float, flops: float, gpu: GPU, bw_eff: float, mm_eff: float) -> float:
    return max(byts / (gpu.copy_tbs * 1e12 * bw_eff), flops / (gpu.bf16_tflops * 1e12 * mm_eff))


def active_experts(tokens: float, n_experts: int, top_k: int) -> float:
    """Expected distinct experts hit by `tokens` tokens routed uniformly, top_k each."""
    return n_experts * (1.0 - (1.0 - top_k / n_experts) ** tokens)


def expert_shard_work(cfg: ModelConfig, tokens: int, gpus: int) -> dict:
    """One MoE layer's routed-expert work on one GPU of `gpus` (expert parallel, E / gpus experts
    each; every shard computes only the slots routed to its experts and streams only the experts
    they hit, `sharding.moe_experts`), under uniform balanced routing: rows (token-expert slots),
    experts streamed, bytes (INT4 + scales) and FLOPs, each the mean over the GPUs."""
    per_expert = 3 * cfg.hidden_size * cfg.moe_intermediate_size
    experts = active_experts(tokens, cfg.n_routed_experts, cfg.num_experts_per_tok) / gpus
    rows = tokens * cfg.num_experts_per_tok / gpus
    return dict(rows=rows, experts=experts, bytes=experts * per_expert * INT4_BYTES,
                flops=2.0 * rows * per_expert)


def moe_seconds(gpu: GPU, cal: Calibration, cfg: ModelConfig, tokens: int, gpus: int) -> float:
    """Routed experts of one MoE layer on one GPU of `gpus` (expert parallel, `expert_shard_work`)."""
    work = expert_shard_work(cfg, tokens, gpus)
    return max(cal.moe_min_us * 1e-6, _roof(work["bytes"], work["flops"], gpu, cal.moe_bw_eff, cal.moe_mm_eff))


def attention_seconds(gpu: GPU, cal: Calibration, cfg: ModelConfig, streams: int, q: int, ctx: int,
                      gpus: int) -> float:
    """Absorbed MLA core (scores + softmax + values) of one layer, H/gpus heads, whole cache:
    cal.attn_fixed_us + max(bytes / copy, FLOPs / matmul) / cal.attn_eff, the FLOPs over each
    stream's Q x H/gpus (node, head) rows rounded up to whole blocks of cal.attn_rows (the kernel
    computes its padded rows in full: at 8 heads per GPU a budget-16 tree's 17 x 8 = 136 rows are
    3 blocks of 64, 1.41x the work; at H 64, or at 8 heads with Q a multiple of 8, none)."""
    dk = cfg.kv_lora_rank + cfg.qk_rope_head_dim
    heads = cfg.num_attention_heads / gpus
    rows = math.ceil(q * heads / cal.attn_rows) * cal.attn_rows
    flops = 2.0 * streams * rows * (ctx + q) * (dk + cfg.kv_lora_rank)
    byts = BF16 * streams * ((ctx + q) * dk + q * heads * (dk + cfg.kv_lora_rank))
    return cal.attn_fixed_us * 1e-6 + _roof(byts, flops, gpu, 1.0, 1.0) / cal.attn_eff


def dense_params(cfg: ModelConfig, layer: int, gpus: int) -> float:
    """bf16 weights one GPU reads per layer besides the routed experts (attention projections,
    shared expert or dense MLP, router)."""
    h, d = cfg.num_attention_heads, cfg.hidden_size
    replicated = d * ((cfg.q_lora_rank or 0) + cfg.kv_lora_rank + cfg.qk_rope_head_dim)
    split = ((cfg.q_lora_rank or d) * h * cfg.qk_head_dim
             + cfg.kv_lora_rank * h * (cfg.qk_nope_head_dim + cfg.v_head_dim) + h * cfg.v_head_dim * d)
    if cfg.is_moe_layer(layer):
        replicated += d * cfg.n_routed_experts
        split += 3 * d * cfg.n_shared_experts * cfg.moe_intermediate_size
    else:
        split += 3 * d * cfg.intermediate_size
    return replicated + split / gpus


def rest_seconds(gpu: GPU, cal: Calibration, cfg: ModelConfig, tokens: int, layer: int, gpus: int) -> float:
    """Everything in a layer but attention core, routed experts and communication."""
    p = dense_params(cfg, layer, gpus)
    # absorbed-form per-head maps: q_nope -> latent and latent -> v, H/gpus heads
    absorb = 2.0 * cfg.num_attention_heads / gpus * cfg.kv_lora_rank * (cfg.qk_nope_head_dim + cfg.v_head_dim)
    return cal.layer_us * 1e-6 + _roof(p * BF16, tokens * (2.0 * p + absorb), gpu, cal.dense_bw_eff,
                                       cal.dense_mm_eff)


def verify_part_floors(cfg: ModelConfig, streams: int, q: int, ctx: int, copy_tbs: float,
                       matmul_tflops: float, param_bytes: float = BF16) -> dict[str, dict]:
    """One GPU's floor of each part of a verify step (all layers) in the parts that
    `timing.part_of` splits a traced step into: {part: {bytes, flops, floor_us}}, floor =
    max(bytes / copy, FLOPs / matmul) at the given rates (the ceilings measured in the same run).
    T = streams x q tokens against `ctx` cached tokens per stream; routed experts INT4
    (`expert_shard_work` at 1 GPU), other weights `param_bytes` per value; activations' traffic
    is left out (norms and embedding: the rows they read and write)."""
    t, d, h = streams * q, cfg.hidden_size, cfg.num_attention_heads
    layers = range(cfg.num_hidden_layers)
    moe = [i for i in layers if cfg.is_moe_layer(i)]
    dense = [i for i in layers if not cfg.is_moe_layer(i)]
    proj = (d * ((cfg.q_lora_rank or 0) + cfg.kv_lora_rank + cfg.qk_rope_head_dim)
            + (cfg.q_lora_rank or d) * h * cfg.qk_head_dim
            + cfg.kv_lora_rank * h * (cfg.qk_nope_head_dim + cfg.v_head_dim) + h * cfg.v_head_dim * d)
    dk = cfg.kv_lora_rank + cfg.qk_rope_head_dim
    work = {   # part: (bytes, flops), all layers
        "attention core": (len(layers) * BF16 * streams * ((ctx + q) * dk + q * h * (dk + cfg.kv_lora_rank)),
                           len(layers) * 2.0 * streams * q * h * (ctx + q) * (dk + cfg.kv_lora_rank)),
        "attention projections": (len(layers) * proj * param_bytes, len(layers) * 2.0 * t * proj),
        "router": (len(moe) * d * cfg.n_routed_experts * param_bytes, len(moe) * 2.0 * t * d * cfg.n_routed_experts),
        "routed experts": tuple(len(moe) * expert_shard_work(cfg, t, 1)[k] for k in ("bytes", "flops")),
        "shared expert": (len(moe) * 3 * d * cfg.n_shared_experts * cfg.moe_intermediate_size * param_bytes,
                          len(moe) * 6.0 * t * d * cfg.n_shared_experts * cfg.moe_intermediate_size),
        "MLP": (len(dense) * 3 * d * cfg.intermediate_size * param_bytes,
                len(dense) * 6.0 * t * d * cfg.intermediate_size),
        "norms": ((2 * len(layers) + 1) * 2 * t * d * BF16, 0.0),
        "lm_head": (d * cfg.vocab_size * param_bytes, 2.0 * t * d * cfg.vocab_size),
        "embedding": (t * d * param_bytes, 0.0),
    }
    return {part: dict(bytes=b, flops=f, floor_us=max(b / (copy_tbs * 1e12), f / (matmul_tflops * 1e12)) * 1e6)
            for part, (b, f) in work.items()}


def allreduce_seconds(gpu: GPU, cal: Calibration, byts: float, gpus: int) -> float:
    if gpus == 1:
        return 0.0
    return gpu.link_latency_us * 1e-6 + 2 * (gpus - 1) / gpus * byts / (gpu.link_gbs * 1e9 * cal.comm_eff)


def tree_seconds(gpu: GPU, cal: Calibration, budget: int) -> float:
    """build_tree: cal.tree_us (H200, log-interpolated in budget) x H200 copy / this GPU's copy."""
    b, us = zip(*cal.tree_us)
    t = np.interp(math.log(max(budget, 1)), np.log(b), us) * 1e-6
    return float(t) * GPUS["H200"].copy_tbs / gpu.copy_tbs


@dataclasses.dataclass(frozen=True)
class StepTime:
    """Seconds per step by part (all layers summed)."""

    attention: float
    moe: float
    rest: float
    comm: float
    head: float
    draft: float
    tree: float
    overhead: float

    @property
    def total(self) -> float:
        return sum(dataclasses.astuple(self))


def step_time(gpu: GPU, cal: Calibration, dep: Deployment, streams: int, budget: int) -> StepTime:
    """One DDTree step (budget >= 1) or a plain decode step (budget 0: no draft, no tree)."""
    cfg, g = dep.model, dep.gpus
    q = budget + 1
    t = streams * q
    layers = range(cfg.num_hidden_layers)
    attn = cfg.num_hidden_layers * attention_seconds(gpu, cal, cfg, streams, q, dep.ctx, g)
    moe = sum(moe_seconds(gpu, cal, cfg, t, g) for i in layers if cfg.is_moe_layer(i))
    rest = sum(rest_seconds(gpu, cal, cfg, t, i, g) for i in layers)
    comm = 2 * cfg.num_hidden_layers * allreduce_seconds(gpu, cal, t * cfg.hidden_size * BF16, g)
    head_p = cfg.hidden_size * cfg.vocab_size / g
    head = _roof(head_p * BF16, 2.0 * t * head_p, gpu, cal.dense_bw_eff, cal.dense_mm_eff)
    draft = tree = 0.0
    if budget:
        dp = drafter_params(dep.drafter) / g
        n = streams * dep.drafter.block_size
        draft = (_roof(dp * BF16, 2.0 * n * dp, gpu, cal.dense_bw_eff, cal.dense_mm_eff)
                 + _roof(head_p * BF16, 2.0 * n * head_p, gpu, cal.dense_bw_eff, cal.dense_mm_eff))
        tree = tree_seconds(gpu, cal, budget)
    return StepTime(attn, moe, rest, comm, head, draft, tree, cal.step_us * 1e-6)


def drafter_params(dc: DrafterConfig) -> float:
    """DFlash drafter weights (layers + context fc), without the shared embedding / lm_head."""
    d, hd = dc.hidden_size, dc.head_dim
    attn = d * hd * (2 * dc.num_attention_heads + 2 * dc.num_key_value_heads)
    return dc.num_hidden_layers * (attn + 3 * d * dc.intermediate_size) + len(dc.target_layer_ids) * d * d


@dataclasses.dataclass(frozen=True)
class TauCurve:
    """Mean acceptance length against budget, linear in log(budget) between points, flat outside."""

    budgets: tuple[int, ...]
    taus: tuple[float, ...]

    def __call__(self, budget) -> np.ndarray:
        return np.interp(np.log(np.maximum(budget, 1)), np.log(self.budgets), self.taus)

    @classmethod
    def parse(cls, text: str) -> "TauCurve":
        """"8:3.0,64:4.8" -> TauCurve."""
        pairs = sorted((int(b), float(t)) for b, t in (p.split(":") for p in text.split(",")))
        return cls(tuple(b for b, _ in pairs), tuple(t for _, t in pairs))


# Assumed K2.6 + DFlash acceptance at temperature 0 (no measurement exists in this repo): concave in
# log(budget): ~1.7 for one draft token, ~3 at budget 8 (DFlash-chain-like), ~6.2 at 1024.
DEFAULT_TAU = TauCurve((1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
                       (1.7, 2.1, 2.6, 3.0, 3.6, 4.2, 4.8, 5.3, 5.7, 6.0, 6.2))
# powers of two and their midpoints, each also one less: at 8 heads per GPU a budget one short of a
# multiple of 8 fills whole 64-row attention blocks (Q = budget + 1 nodes x 8 heads); one more starts
# a block with 8 real rows of 64
BUDGETS = tuple(sorted({b - d for b in (2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
                        for d in (0, 1)}))


def project(gpu: GPU, cal: Calibration, dep: Deployment, tau: TauCurve, streams: int,
            budgets=BUDGETS) -> list[dict]:
    """Tokens/s per budget; budget 0 is plain autoregressive decoding (tau 1)."""
    rows = []
    for b in (0,) + tuple(budgets):
        st = step_time(gpu, cal, dep, streams, b)
        t = float(tau(b)) if b else 1.0
        rows.append(dict(gpu=gpu.name, calibration=cal.name, streams=streams, budget=b, tau=t,
                         step_ms=st.total * 1e3, tokens_per_second=streams * t / st.total,
                         parts_ms={k: v * 1e3 for k, v in dataclasses.asdict(st).items()}))
    return rows


def best(rows: list[dict]) -> dict:
    """The speculative row (budget >= 1) with the most tokens/s."""
    return max((r for r in rows if r["budget"]), key=lambda r: r["tokens_per_second"])
