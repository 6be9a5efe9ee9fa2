"""Routing alignment on the device (the role of vLLM's `moe_align_block_size`).

The T*k token slots (slot = t*k + j) are sorted by expert and each expert's run is padded to a
multiple of the row block `block_m`, so every block of `block_m` sorted rows belongs to one
expert; within an expert, slots keep their order. Shapes are static for a given (T, k, E,
block_m): the number of blocks is the worst case over all routings, unused trailing blocks carry
expert -1. Slots marked invalid (`valid`) are dropped: they take no row and no block, so the
kernels never compute them. A slot's place within its expert's run is the count of earlier slots routed to the same
expert: for up to COUNT_MAX_SLOTS slots it is counted directly (one [n, n] comparison, a single
fused reduction), and the expert counts and padded run starts are comparison sums too; beyond, a
stable argsort gives it.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

# T*k up to which the place in the expert's run is counted, not sorted: counting is the faster
# form up to about 10k slots, the sort above (docs/kernels/moe.md).
COUNT_MAX_SLOTS = 10240


class Routing(NamedTuple):
    row_slot: jax.Array      # [R] int32: slot held by each sorted row; T*k marks a padding row
    block_expert: jax.Array  # [R / block_m] int32: expert of each row block; -1 = unused block
    slot_row: jax.Array      # [T*k] int32: sorted row of each slot (inverse of row_slot); R for a
                             # dropped slot


def max_blocks(num_slots: int, num_experts: int, block_m: int) -> int:
    """Most row blocks any routing of `num_slots` slots over `num_experts` experts can need."""
    return (num_slots + min(num_experts, num_slots) * (block_m - 1)) // block_m


def align_routing(topk_ids, num_experts: int, block_m: int, valid=None) -> Routing:
    """topk_ids int [T, k] (values in [0, num_experts)), valid bool [T, k] or None (every slot) ->
    Routing of the valid slots only; jit-able."""
    if topk_ids.ndim != 2 or not jnp.issubdtype(topk_ids.dtype, jnp.integer):
        raise ValueError(f"topk_ids: expected an integer [T, k] array, got {topk_ids.dtype} "
                         f"{topk_ids.shape}")
    if valid is not None and (valid.shape != topk_ids.shape or valid.dtype != jnp.bool_):
        raise ValueError(f"valid: expected a bool {tuple(topk_ids.shape)} array like topk_ids, got "
                         f"{valid.dtype} {valid.shape}")
    if block_m < 1 or num_experts < 1:
        raise ValueError(f"block_m={block_m} and num_experts={num_experts} must be >= 1")
    flat = topk_ids.reshape(-1).astype(jnp.int32)
    n = flat.shape[0]
    nb = max_blocks(n, num_experts, block_m)
    dropped = jnp.zeros((n,), bool) if valid is None else ~valid.reshape(-1)
    flat = jnp.where(dropped, num_experts, flat)   # a dropped slot's expert: none of [0, E)
    slot = jnp.arange(n, dtype=jnp.int32)
    experts = jnp.arange(num_experts, dtype=jnp.int32)
    if n <= COUNT_MAX_SLOTS:
        # Comparisons and sums only: each a single fused reduction on the GPU, where a bincount,
        # cumsum or scatter is a kernel of its own (plus one to initialise its output).
        counts = jnp.sum(flat[None, :] == experts[:, None], axis=1, dtype=jnp.int32)
        padded = (counts + block_m - 1) // block_m * block_m
        start_padded = jnp.sum(jnp.where(experts[None, :] < experts[:, None], padded[None, :], 0), axis=1)
        earlier = (flat[None, :] == flat[:, None]) & (slot[None, :] < slot[:, None])
        row = (start_padded[jnp.minimum(flat, num_experts - 1)]
               + jnp.sum(earlier, axis=1, dtype=jnp.int32)).astype(jnp.int32)
        row, order = jnp.where(dropped, nb * block_m, row), slot
        slot_row = row
    else:
        counts = jnp.bincount(flat, length=num_experts)      # the dropped slots' id is not counted
        padded = (counts + block_m - 1) // block_m * block_m
        start_padded = jnp.cumsum(padded) - padded
        order = jnp.argsort(flat, stable=True).astype(jnp.int32)     # by expert, dropped slots last
        expert = jnp.minimum(flat[order], num_experts - 1)
        start = jnp.cumsum(counts) - counts
        row = (start_padded[expert] + slot - start[expert]).astype(jnp.int32)
        row = jnp.where(dropped[order], nb * block_m, row)
        slot_row = jnp.zeros((n,), jnp.int32).at[order].set(row)
    row_slot = jnp.full((nb * block_m,), n, jnp.int32).at[row].set(order, mode="drop")
    first = row_slot[::block_m]     # real in every used block: an expert's padding is < block_m rows
    block_expert = jnp.where(first < n, flat[jnp.minimum(first, n - 1)], -1)
    return Routing(row_slot, block_expert, slot_row)
