"""The device memory a decode needs beyond the params, checked before anything is allocated.

`step_bytes` is a lower bound from the shapes alone: the target's latent cache and the drafter's
context cache, the tree's [N, N] visibility and bitmask, the draft logits, and the verify's
float32 logits and residual stream (N = budget + 1 verified tokens per stream). `check_memory`
refuses a call whose bound exceeds what the device has free, naming the budget, the streams and
the parts, instead of letting XLA fail deep inside an allocation. Under a mesh the bound is
divided by the mesh's devices (every part shards by streams or vocabulary at best), so the check
never refuses a call that could fit. bench/memory_plan.py holds the full per-device plan.
"""

from __future__ import annotations

import math

import jax

from ddtree_jax import sharding
from ddtree_jax.engine.state import Plan

GIB = 2 ** 30


def step_bytes(plan: Plan, streams: int, max_len: int, itemsize: int) -> dict[str, int]:
    """Lower-bound bytes of a decode of `streams` streams with `max_len` cache slots each and
    params / caches of `itemsize` bytes, by part."""
    t, d = plan.tcfg, plan.dcfg
    n = plan.nodes
    parts = {"target_cache": t.num_hidden_layers * streams * max_len * t.latent_dim * itemsize,
             "verify": streams * n * (t.vocab_size * 4 * (1 if plan.sampling.greedy else 2)
                                      + 3 * t.hidden_size * itemsize)}
    if d is not None:
        parts["drafter_cache"] = (2 * d.num_hidden_layers * streams * d.num_key_value_heads * max_len
                                  * d.head_dim * itemsize)
        parts["draft_logits"] = streams * d.block_size * t.vocab_size * 4
    if plan.method == "ddtree":
        parts["tree"] = streams * n * (n + 4 * -(-n // 32))
    return parts


def free_bytes(device) -> int | None:
    """Bytes the device can still allocate: its allocator's limit less what is in use (GPU); on a
    CPU the host's available memory, or the process's cgroup limit less its usage where that is
    lower; None where neither is known."""
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
    if device.platform != "cpu":
        return None
    free = []
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        free.append(int(fields["MemAvailable"].split()[0]) * 1024)
    except (OSError, KeyError, ValueError):
        pass
    try:
        with open("/sys/fs/cgroup/memory.max") as f, open("/sys/fs/cgroup/memory.current") as g:
            limit, used = f.read().strip(), g.read().strip()
        if limit != "max":
            free.append(int(limit) - int(used))
    except (OSError, ValueError):
        pass
    return min(free) if free else None


def check_memory(plan: Plan, streams: int, max_len: int, tparams) -> None:
    """ValueError when `step_bytes` (at the target params' dtype) exceeds the free memory of the first local device (the total
    over a mesh's devices under `jax.set_mesh`)."""
    mesh = sharding.current_mesh()
    devices = math.prod(dict(mesh.shape).values()) if mesh is not None else 1
    free = free_bytes(jax.local_devices()[0])
    itemsize = jax.tree_util.tree_leaves(tparams["embed_tokens"])[0].dtype.itemsize
    parts = step_bytes(plan, streams, max_len, itemsize)
    need = sum(parts.values())
    if free is None or need <= free * devices:
        return
    detail = ", ".join(f"{k} {v / GIB:.2f}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1]))
    what = f"budget={plan.budget}" if plan.method == "ddtree" else f"method={plan.method!r}"
    raise ValueError(
        f"{what} with {streams} stream(s) and {max_len} cache slots each needs at least "
        f"{need / GIB:.2f} GiB beyond the params ({detail} GiB), but {free * devices / GIB:.2f} "
        f"GiB is free on {devices} device(s): lower the budget, the streams or max_new_tokens")
