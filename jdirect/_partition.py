"""How XLA splits a gather over devices: along the indices.

A custom call carries no sharding rule of its own, so XLA's partitioner
would replicate its operands: every device would all-gather the indices
and read every row. `by_indices` tells it instead that rows follow the
indices (each device reads the rows of its own index shard) and that the
table-side operands (an array table, a handle, a cache) are whole on every
device.
"""

from __future__ import annotations

from typing import Callable

import jax
from jax.experimental.custom_partitioning import (ArrayMapping, SdyShardingRule,
                                                  custom_partitioning)
from jax.sharding import NamedSharding, PartitionSpec


def by_indices(call: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
    """`call`, partitioned along its last operand's sharding.

    `call(*table_operands, idx)` returns rows of shape
    `idx.shape + row_shape` that depend only on the table and on the index
    at the same position, so each device can call it on its own index
    shard (the per-device call is traced with the local shapes). Its
    output is sharded like `idx` along the index dims and replicated along
    the row dims; the table-side operands are replicated (one sharded
    across devices is all-gathered first). On one device, or inside
    shard_map, `call` is lowered as it is; over the axes a shard_map leaves
    automatic (`axis_names`), the operands are replicated.
    """
    partitioned = custom_partitioning(call)

    def shardings(mesh, arg_shapes):
        idx = arg_shapes[-1].sharding
        if not isinstance(idx, NamedSharding):  # no mesh in the program
            raise NotImplementedError(
                "jdirect.gather over several devices needs indices sharded on a "
                f"jax.sharding.Mesh (a NamedSharding), got {idx}")
        # Spec entries beyond an array's rank are dropped: the row dims of
        # the output have none (replicated).
        rows = NamedSharding(mesh, PartitionSpec(*idx.spec))
        table = tuple(NamedSharding(mesh, PartitionSpec()) for _ in arg_shapes[:-1])
        return rows, table + (idx,)

    def partition(mesh, arg_shapes, result_shape):
        rows, args = shardings(mesh, arg_shapes)
        return mesh, call, rows, args

    def infer_sharding_from_operands(mesh, arg_shapes, result_shape):
        return shardings(mesh, arg_shapes)[0]

    def sharding_rule(mesh, operand_types, result_types):
        # One factor per dim: the index dims pass through to the output's
        # leading dims; every other dim (table side, output rows) must be
        # whole on each device.
        *table_types, idx_type = (t.shape for t in operand_types)
        index = tuple(f"i{d}" for d in range(len(idx_type)))
        table = tuple(ArrayMapping(*(f"t{k}_{d}" for d in range(len(shape))))
                      for k, shape in enumerate(table_types))
        row = tuple(f"r{d}" for d in range(len(result_types[0].shape) - len(index)))
        whole = tuple(f for mapping in table for f in mapping) + row
        return SdyShardingRule(table + (ArrayMapping(*index),), (ArrayMapping(*index, *row),),
                               need_replication_factors=whole)

    partitioned.def_partition(partition, infer_sharding_from_operands=infer_sharding_from_operands,
                              sharding_rule=sharding_rule)

    def split_call(*operands: jax.Array) -> jax.Array:
        # Inside shard_map the partitioner's callbacks get no mesh: the call
        # is left to it as it is (per device, or replicated over the axes
        # left automatic).
        if jax.typeof(operands[-1]).sharding.mesh.manual_axes:
            return call(*operands)
        return partitioned(*operands)

    return split_call


def typed_like_indices(idx: jax.Array, rows: jax.ShapeDtypeStruct) -> jax.ShapeDtypeStruct:
    """`rows` (a `by_indices` call's output) with the sharding type of `idx`
    along the index dims.

    Under explicit mesh axes the type is the sharding: an untyped result
    would count as replicated, and the next operation would all-gather it.
    """
    sharding = jax.typeof(idx).sharding
    if sharding.mesh.empty:
        return rows
    return jax.ShapeDtypeStruct(rows.shape, rows.dtype,
                                sharding=NamedSharding(sharding.mesh, PartitionSpec(*sharding.spec)))
