"""Row-wise sparse optimizers for embedding tables: SGD, Adagrad (element-
and row-wise) and lazy Adam.

Each step touches only the rows a batch looked up. Their gradient rows are
summed per distinct id (`dedup`); the touched rows of the table and of the
optimizer's per-row slots (moments, which are tables of the same shape,
also in host memory for a HostTable) are updated in place, in the same
compiled program as the forward and backward passes. Rows no batch touched
are never read or written, and neither are their slots ("lazy" moments).

On a float32 or bfloat16 HostTable (but for Adam with per_row_steps) one
call (`jdirect.sparse_update`) reads each touched row's slot rows, applies
the rule and stores the rows back, so on a GPU the reads of some rows
overlap the writes of others on the full-duplex link. Otherwise (device
arrays, other dtypes, that rule) the touched rows are gathered, updated on
the device and written back.

The optimizers mirror optax's element-wise rules (row-wise Adagrad,
FBGEMM's), applied to the touched rows only:

  sparse_sgd      optax.sgd(lr)
  sparse_adagrad  optax.adagrad(lr, initial_accumulator_value, eps)
  sparse_rowwise_adagrad  FBGEMM's row-wise Adagrad: one accumulator a row
                  (the mean of its squared gradients), for tables whose
                  row-wide slots would not fit beside them
  sparse_adam     optax.adam(lr, b1, b2, eps) on the touched rows, with the
                  moments of untouched rows frozen (dense Adam would decay
                  them and move their rows). The bias correction uses the
                  global step count, as torch.optim.SparseAdam and
                  TensorFlow's LazyAdam do, or with `per_row_steps=True` the
                  number of steps that touched the row, as DGL's SparseAdam.

For SGD and both Adagrads a zero gradient leaves a row and its slot
unchanged, so they equal their dense rule on the whole table exactly; lazy
Adam equals optax.adam applied at each step to the sub-table of the
touched rows, with their moments and the step count carried between steps.

Usage, with optax for the dense parameters::

    table = embeddings.create_table(num_nodes, 128, seed=0)  # owns the rows
    sparse = embeddings.sparse_adam(1e-2)
    owned = sparse.init(table)                                # owns the moments

    @jax.jit
    def train_step(params, opt_state, emb, emb_state, ids, labels):
        rows = embeddings.lookup(emb, ids)
        loss, (g_params, g_rows) = jax.value_and_grad(loss_fn, argnums=(0, 1))(
            params, rows, labels)
        updates, opt_state = tx.update(g_params, opt_state, params)
        params = optax.apply_updates(params, updates)
        emb, emb_state = sparse.apply(emb, emb_state, ids, g_rows, rows=rows)
        return params, opt_state, emb, emb_state, loss

    emb, emb_state = table, owned
    for ids, labels in batches:
        params, opt_state, emb, emb_state, loss = train_step(
            params, opt_state, emb, emb_state, ids, labels)
    embeddings.close((table, owned))

A HostTable that a jitted `apply` returns is the next version of the one
passed in (the same host memory, see `jdirect.write_rows`): a view that
does not keep the memory alive. Keep the HostTables you made (`table` and
`init`'s state above) referenced and open while their versions are used,
and carry the versions (and the state's count) from step to step like
any state.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._arrays import as_indices
from ..host_table import HostTable
from . import _rows
from ._checks import check_finite, check_operands, check_table
from .embedding import dedup, each_block

Schedule = Callable[[jax.Array], jax.Array]


class SparseState(NamedTuple):
    """A sparse optimizer's state (a pytree).

    Attributes:
      count: int32 scalar, the number of `apply` calls so far (the step a
        learning-rate schedule is evaluated at, and Adam's global step).
      slots: name -> table: per-row state of the same kind as the table
        (a HostTable for a HostTable): Adagrad's "sum_of_squares" and
        Adam's "mu" and "nu" of shape (num_embeddings, dim); with
        per_row_steps, Adam's int32 "steps" of shape (num_embeddings,);
        row-wise Adagrad's "sum_of_squares" of shape (num_embeddings,).
    """

    count: jax.Array
    slots: dict[str, Any]


class SparseOptimizer(NamedTuple):
    """A row-wise sparse optimizer: two pure functions, like optax's
    GradientTransformation, and the size of its per-row state.

    init(table, *, memory=None) -> SparseState
      Allocates the slots next to `table` (a HostTable or a jax.Array of
      shape (num_embeddings, dim), floating): HostTables in host memory
      (`memory` as in `HostTable.empty`; default: the table's own kind) or
      device arrays. Slots are float32 (float64 for a float64 table),
      whatever the table's dtype. Not jittable (it allocates host memory).

    apply(table, state, ids, row_grads, *, rows=None) -> (table, state)
      One step. `ids`: int, any shape; padding ids (outside [0,
      num_embeddings)) contribute nothing, and duplicates add their
      gradients (the table's true gradient; DGL's optimizers average
      them). `row_grads`: shape ids.shape + (dim,), the gradient of the
      loss with respect to `lookup(table, ids)`. `rows`: that lookup's
      result, if the caller has it, so the touched rows are not read from
      the table a second time. Jittable; writes the touched rows of the
      table and of the slots in place and returns their next versions.
      Every operand is checked while tracing, before anything is read or
      written (all or nothing): ValueError for `row_grads` or `rows` of a
      shape other than ids.shape + (dim,), a state of other slots or slot
      shapes, a closed or read-only HostTable (table or slot), a table
      version already written in this trace, a learning rate given as a
      number that is not finite; TypeError for ids other than int32/int64,
      gradients or rows that are not floating, slots of another dtype. A
      schedule's learning rate is an array known only when the program
      runs: a step where it is not finite writes nothing (the count still
      advances). A closed HostTable is refused before anything runs, also
      by a step compiled while it was open (as `jdirect.gather`).

    slot_elements(dim) -> int
      The slots' values a row of a (num_embeddings, dim) table holds (each
      4 bytes for a float32 table): what a step reads and writes beside a
      row it touches.
    """

    init: Callable[..., SparseState]
    apply: Callable[..., tuple[Any, SparseState]]
    slot_elements: Callable[[int], int]


# A rule maps (rows, summed gradient rows, slot rows, step, lr) to
# (new rows, new slot rows), computed in the slots' precision.
Rule = Callable[[jax.Array, jax.Array, dict[str, jax.Array], jax.Array, jax.Array],
                tuple[jax.Array, dict[str, jax.Array]]]
# Adam's bias corrections (1 - b1**t, 1 - b2**t) at step t, in a dtype.
Corrections = Callable[[jax.Array, Any], tuple[jax.Array, jax.Array]]


def _slot_dtype(dtype: Any) -> np.dtype:
    return np.dtype(jnp.promote_types(dtype, jnp.float32))


def _new_slot(table: Any, shape: tuple[int, ...], dtype: np.dtype, value: float,
              memory: str | None) -> Any:
    if isinstance(table, HostTable):
        if memory is None:
            # Beside a managed table, "auto": managed while the GPU's free
            # memory allows (the lent machines' rule), else pinned with a
            # warning; asking for "managed" refused the second slot of an
            # 85 GB Adagrad table on an H200 (benchmarks/results/journal/LOG.md,
            # 2026-11-26).
            memory = "pinned" if table.memory == "pinned" else "auto"
        slot = HostTable.empty(shape, dtype, memory=memory)
        each_block(slot.numpy(), lambda i, block: block.fill(value))
        return slot
    return jnp.full(shape, value, dtype)


class Slot(NamedTuple):
    """A slot's initial value, whether it holds one value a row (shape
    (num_embeddings,)) rather than a row's width of them, and its dtype
    (None: float32, or float64 for a float64 table)."""

    value: float
    per_row: bool = False
    dtype: Any = None


def _optimizer(name: str, rule: Rule, learning_rate: float | Schedule, slots: dict[str, Slot],
               fused: _rows.FusedRule | None,
               corrections: Corrections | None = None) -> SparseOptimizer:
    """`rule` on jax.Array tables; on HostTables `fused` (the same rule,
    None if it has no fused form) when `_rows.fusable`, with `corrections`
    of the global step."""
    if not callable(learning_rate):
        check_finite("learning_rate", learning_rate, name)

    def dtypes(table: Any) -> dict[str, tuple[np.dtype, bool]]:
        default = _slot_dtype(table.dtype)
        return {k: (default if v.dtype is None else np.dtype(v.dtype), v.per_row)
                for k, v in slots.items()}

    def init(table: Any, *, memory: str | None = None) -> SparseState:
        check_table(table)
        made: dict[str, Any] = {}
        try:
            for key, (dtype, per_row) in dtypes(table).items():
                shape = tuple(table.shape[:1] if per_row else table.shape)
                made[key] = _new_slot(table, shape, dtype, slots[key].value, memory)
        except BaseException:
            close(made)
            raise
        return SparseState(jnp.zeros((), jnp.int32), made)

    def apply(table: Any, state: SparseState, ids: Any, row_grads: Any, *,
              rows: jax.Array | None = None) -> tuple[Any, SparseState]:
        check_table(table)
        num, dim = table.shape
        dtype = _slot_dtype(table.dtype)
        ids = as_indices(ids)
        row_grads, rows = check_operands(table, state, ids, row_grads, rows, dtypes(table),
                                         SparseState)
        grads = dedup(ids, row_grads, num)
        old = None if rows is None else jnp.reshape(rows, (-1, dim))[grads.first]
        step = state.count + 1
        lr = learning_rate(state.count) if callable(learning_rate) else learning_rate
        if isinstance(lr, jax.Array):
            # A schedule's value, known only in the program (no host sync):
            # a step whose rate is not finite writes nothing (every id
            # becomes padding).
            lr = jnp.asarray(lr, dtype)
            grads = grads._replace(ids=jnp.where(jnp.isfinite(lr), grads.ids,
                                                 jnp.asarray(num, grads.ids.dtype)))
        else:
            check_finite("learning_rate", lr, "sparse optimizer apply")
            lr = jnp.asarray(lr, dtype)
        if _rows.fusable(fused, table, state.slots):
            table, written = _rows.update(
                fused, table, state.slots, grads.ids, grads.rows.astype(dtype),
                None if old is None else old.astype(table.dtype), lr,
                corrections(step, dtype) if corrections else None)
            return table, SparseState(step, written)
        if old is None:
            old = _rows.read(table, grads.ids)
        slot_rows = {name: _rows.read(t, grads.ids) for name, t in state.slots.items()}
        new, new_slots = rule(old.astype(dtype), grads.rows.astype(dtype), slot_rows, step, lr)
        table = _rows.write(table, grads.ids, new)
        written = {name: _rows.write(state.slots[name], grads.ids, new_slots[name])
                   for name in state.slots}
        return table, SparseState(step, written)

    return SparseOptimizer(init, apply, lambda dim: sum(1 if v.per_row else dim
                                                        for v in slots.values()))


def sparse_sgd(learning_rate: float | Schedule) -> SparseOptimizer:
    """Row-wise SGD: `row -= lr * grad` for each touched row (optax.sgd).

    `learning_rate` is a float or an optax schedule of the step count.

    Raises:
      ValueError: a learning rate given as a number that is not finite.
      TypeError: a learning rate that is neither a real number nor callable.
    """

    def rule(w, g, slots, step, lr):
        return w - lr * g, {}

    return _optimizer("sparse_sgd", rule, learning_rate, {}, _rows.FusedRule("sgd"))


def sparse_adagrad(learning_rate: float | Schedule, initial_accumulator_value: float = 0.1,
                   eps: float = 1e-7) -> SparseOptimizer:
    """Row-wise Adagrad with an element-wise accumulator per touched row, as
    optax.adagrad: `acc += g**2; row -= lr * g / sqrt(acc + eps)`.

    Slot "sum_of_squares" starts at `initial_accumulator_value` (>= 0).

    Raises:
      ValueError: initial_accumulator_value < 0; a hyperparameter (a
        learning rate given as a number, initial_accumulator_value, eps)
        that is not finite.
      TypeError: a hyperparameter that is not a real number.
    """
    for name, value in (("initial_accumulator_value", initial_accumulator_value), ("eps", eps)):
        check_finite(name, value, "sparse_adagrad")
    if not initial_accumulator_value >= 0:
        raise ValueError(f"initial_accumulator_value must be >= 0, got "
                         f"{initial_accumulator_value!r}")

    def rule(w, g, slots, step, lr):
        acc = g * g + slots["sum_of_squares"]
        scale = jnp.where(acc > 0, jax.lax.rsqrt(acc + eps), 0.0)
        return w - lr * (scale * g), {"sum_of_squares": acc}

    return _optimizer("sparse_adagrad", rule, learning_rate,
                      {"sum_of_squares": Slot(initial_accumulator_value)},
                      _rows.FusedRule("adagrad", eps=eps))


def sparse_adam(learning_rate: float | Schedule, b1: float = 0.9, b2: float = 0.999,
                eps: float = 1e-8, *, per_row_steps: bool = False) -> SparseOptimizer:
    """Lazy Adam: optax.adam's rule on the touched rows; untouched rows and
    their moments "mu" and "nu" stay as they are.

    Args:
      per_row_steps: False (default): the bias correction uses the global
        step t (the number of `apply` calls), as torch.optim.SparseAdam and
        TensorFlow's LazyAdam. True: it uses t_r, the number of steps that
        touched row r, kept in an int32 slot "steps" (one more table of
        num_embeddings int32), as DGL's SparseAdam: a row seen rarely then
        gets full-sized first updates.

    Raises:
      ValueError: a hyperparameter (a learning rate given as a number, b1,
        b2, eps) that is not finite.
      TypeError: a hyperparameter that is not a real number; per_row_steps
        not a bool.
    """
    for name, value in (("b1", b1), ("b2", b2), ("eps", eps)):
        check_finite(name, value, "sparse_adam")
    if not isinstance(per_row_steps, (bool, np.bool_)):
        raise TypeError(f"sparse_adam: per_row_steps must be True or False, got "
                        f"{per_row_steps!r}")

    def corrections(t, dtype):
        t = t.astype(dtype)
        return 1 - b1 ** t, 1 - b2 ** t

    def rule(w, g, slots, step, lr):
        mu = (1 - b1) * g + b1 * slots["mu"]
        nu = (1 - b2) * (g * g) + b2 * slots["nu"]
        new = {"mu": mu, "nu": nu}
        if per_row_steps:
            t = slots["steps"] + 1
            new["steps"] = t
            t = t[:, None]
        else:
            t = step
        c1, c2 = corrections(t, w.dtype)
        mu_hat = mu / c1
        nu_hat = nu / c2
        return w - lr * (mu_hat / (jnp.sqrt(nu_hat) + eps)), new

    # Per-row steps need a per-row correction: that case keeps the gather,
    # update and write of the other kinds.
    fused = None if per_row_steps else _rows.FusedRule("adam", b1, b2, eps)
    slots = {"mu": Slot(0.0), "nu": Slot(0.0)}
    if per_row_steps:
        slots["steps"] = Slot(0, per_row=True, dtype=np.int32)
    return _optimizer("sparse_adam", rule, learning_rate, slots, fused, corrections)


def sparse_rowwise_adagrad(learning_rate: float | Schedule,
                           eps: float = 1e-8) -> SparseOptimizer:
    """Row-wise Adagrad with one accumulator a row, FBGEMM's and TorchRec's
    EXACT_ROWWISE_ADAGRAD: for each touched row r with summed gradient g_r
    (width dim), `acc[r] += mean(g_r**2); row_r -= lr * g_r / (sqrt(acc[r])
    + eps)`. Its state is one value a row ("sum_of_squares", shape
    (num_embeddings,), float32, or float64 for a float64 table, starting
    at 0) instead of Adagrad's row-wide one: the choice for tables whose
    slots would not fit beside them. A zero gradient leaves a row and its
    accumulator unchanged.

    Raises:
      ValueError: a hyperparameter (a learning rate given as a number, eps)
        that is not finite.
      TypeError: a hyperparameter that is not a real number.
    """
    check_finite("eps", eps, "sparse_rowwise_adagrad")

    def rule(w, g, slots, step, lr):
        # The mean over the row; a row of no elements adds 0, not NaN.
        acc = slots["sum_of_squares"] + jnp.sum(g * g, axis=-1) / max(g.shape[-1], 1)
        scale = lr / (jnp.sqrt(acc) + eps)
        return w - scale[:, None] * g, {"sum_of_squares": acc}

    return _optimizer("sparse_rowwise_adagrad", rule, learning_rate,
                      {"sum_of_squares": Slot(0.0, per_row=True)},
                      _rows.FusedRule("rowwise_adagrad", eps=eps))


def close(tree: Any) -> None:
    """Closes every HostTable in `tree` (e.g. a SparseState); other leaves
    are left alone."""
    for leaf in jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, HostTable)):
        if isinstance(leaf, HostTable):
            leaf.close()
