"""The routed-experts pytree (opaque to the model) and its conversion from / to HF orientation.

bf16 experts (`[in, out]`): {"gate_kernel" [E, d, I], "up_kernel" [E, d, I], "down_kernel" [E, I, d]}.
int4 experts (kernel layout of `int4.py`): {"gate_qweight" int32 [E, dp/8, I], "gate_qscale" bf16
[E, dp/32, I], "up_qweight", "up_qscale", "down_qweight" int32 [E, Ip/8, d], "down_qscale" bf16
[E, Ip/32, d]} with dp, Ip the padded input dims; the three scales may instead all be float16
(the Pallas kernels then multiply in float16). The scales must lie in `int4.scale_range` (the
loader checks; the kernels' fused dequantisation would overflow beyond it, and a check inside a
trace cannot see values). The keys tell the two apart; every leaf has the
expert axis first, so the dict can be sharded over experts and saved with Orbax as it is.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

from pallas_kernels.checks import concrete
from pallas_kernels.moe import int4

BF16_KEYS = ("gate_kernel", "up_kernel", "down_kernel")
INT4_KEYS = ("gate_qweight", "gate_qscale", "up_qweight", "up_qscale", "down_qweight", "down_qscale")


class Dims(NamedTuple):
    num_experts: int
    hidden: int        # d
    intermediate: int  # I
    int4: bool


def dims(experts) -> Dims:
    """Validate an experts dict and return its (E, d, I, is_int4)."""
    if not isinstance(experts, dict):
        raise ValueError(f"experts: expected a dict, got {type(experts).__name__}")
    keys = set(experts)
    if keys == set(BF16_KEYS):
        e, d, i = experts["gate_kernel"].shape
        want = {"gate_kernel": (e, d, i), "up_kernel": (e, d, i), "down_kernel": (e, i, d)}
        is_int4 = False
    elif keys == set(INT4_KEYS):
        e, dw, i = experts["gate_qweight"].shape
        d = experts["down_qweight"].shape[-1]
        iw = experts["down_qweight"].shape[1]
        want = {"gate_qweight": (e, dw, i), "gate_qscale": (e, dw // 4, i),
                "up_qweight": (e, dw, i), "up_qscale": (e, dw // 4, i),
                "down_qweight": (e, iw, d), "down_qscale": (e, iw // 4, d)}
        if dw * 8 != int4.padded_k(d) or iw * 8 != int4.padded_k(i):
            raise ValueError(f"experts: packed input dims {dw * 8}, {iw * 8} are not d={d}, I={i} "
                             f"padded to {int4.KBLOCK}")
        kinds = {k: jnp.dtype(experts[k].dtype).name for k in INT4_KEYS if k.endswith("qscale")}
        if len(set(kinds.values())) != 1 or experts["gate_qscale"].dtype not in int4.SCALE_DTYPES:
            raise ValueError(f"experts: the qscales must all be bfloat16 or all float16, got {kinds}")
        is_int4 = True
    else:
        raise ValueError(f"experts: keys {sorted(keys)} are neither {BF16_KEYS} nor {INT4_KEYS}")
    for k, shape in want.items():
        if tuple(experts[k].shape) != shape:
            raise ValueError(f"experts[{k!r}]: expected shape {shape}, got {tuple(experts[k].shape)}")
    return Dims(e, d, i, is_int4)


def prepare_experts_bf16(gate, up, down) -> dict:
    """HF orientation gate, up [E, I, d], down [E, d, I] -> bf16 experts dict (dtype kept)."""
    if gate.ndim != 3 or up.shape != gate.shape:
        raise ValueError(f"gate/up: expected equal [E, I, d] shapes, got {gate.shape}, {up.shape}")
    e, i, d = gate.shape
    if down.shape != (e, d, i):
        raise ValueError(f"down: expected shape {(e, d, i)}, got {down.shape}")
    t = lambda w: jnp.swapaxes(jnp.asarray(w), 1, 2)
    return {"gate_kernel": t(gate), "up_kernel": t(up), "down_kernel": t(down)}


def prepare_experts_int4(gate_packed, gate_scale, up_packed, up_scale, down_packed,
                         down_scale, scale_dtype=jnp.bfloat16) -> dict:
    """compressed-tensors arrays (int32 [E, N, K/8], bf16 [E, N, K/32]; gate/up N=I K=d, down N=d
    K=I) -> int4 experts dict in the kernel layout, scales in scale_dtype (bfloat16 or float16,
    `int4.to_kernel_layout`). Repacks one expert at a time on the device."""
    e, i, dw = gate_packed.shape
    if down_packed.shape != (e, dw * 8, i // 8):
        raise ValueError(f"down_packed: expected shape {(e, dw * 8, i // 8)}, got {down_packed.shape}")
    if up_packed.shape != gate_packed.shape:
        raise ValueError(f"up_packed: expected shape {gate_packed.shape}, got {up_packed.shape}")
    out = {}
    for name, p, s in (("gate", gate_packed, gate_scale), ("up", up_packed, up_scale),
                       ("down", down_packed, down_scale)):
        out[f"{name}_qweight"], out[f"{name}_qscale"] = int4.to_kernel_layout(
            jnp.asarray(p), jnp.asarray(s), name, scale_dtype)
    return out


def experts_to_hf(experts) -> dict:
    """Exact inverse of prepare_experts_*: HF-orientation {"gate", "up", "down"} (bf16 experts) or
    {"gate_packed", "gate_scale", "up_packed", "up_scale", "down_packed", "down_scale"} (int4)."""
    dm = dims(experts)
    if not dm.int4:
        return {n: jnp.swapaxes(experts[f"{n}_kernel"], 1, 2) for n in ("gate", "up", "down")}
    out = {}
    for name, k in (("gate", dm.hidden), ("up", dm.hidden), ("down", dm.intermediate)):
        out[f"{name}_packed"], out[f"{name}_scale"] = int4.from_kernel_layout(
            experts[f"{name}_qweight"], experts[f"{name}_qscale"], k)
    return out


def check_moe_inputs(x, topk_ids, topk_weights, experts, valid=None) -> Dims:
    """Validate moe_experts' arguments; returns the experts' dims."""
    dm = dims(experts)
    if x.ndim != 2 or x.shape[1] != dm.hidden:
        raise ValueError(f"x: expected shape [T, {dm.hidden}], got {x.shape}")
    if topk_ids.ndim != 2 or topk_ids.shape[0] != x.shape[0]:
        raise ValueError(f"topk_ids: expected shape [{x.shape[0]}, k], got {topk_ids.shape}")
    if not jnp.issubdtype(topk_ids.dtype, jnp.integer):
        raise ValueError(f"topk_ids: expected an integer dtype, got {topk_ids.dtype}")
    if topk_weights.shape != topk_ids.shape:
        raise ValueError(f"topk_weights: expected shape {topk_ids.shape}, got {topk_weights.shape}")
    if not jnp.issubdtype(topk_weights.dtype, jnp.floating):
        raise ValueError(f"topk_weights: expected a float dtype, got {topk_weights.dtype}")
    if valid is not None and (getattr(valid, "shape", None) != topk_ids.shape
                              or getattr(valid, "dtype", None) != jnp.bool_):
        raise ValueError(f"valid: expected a bool array of topk_ids' shape {tuple(topk_ids.shape)}, "
                         f"got {getattr(valid, 'dtype', None)} {getattr(valid, 'shape', None)}")
    ids = concrete(topk_ids)
    if ids is not None and ids.size and (ids.min() < 0 or ids.max() >= dm.num_experts):
        raise ValueError(f"topk_ids: expert ids must lie in [0, E={dm.num_experts}); got {ids.min()}..{ids.max()}")
    return dm
