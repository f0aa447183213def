"""Trainable embedding tables whose rows live in host memory.

`create_table` makes a (num_embeddings, dim) HostTable initialised from a
seed; `lookup` gathers rows of it inside a jitted step; the gradient with
respect to the looked-up rows goes to a row-wise sparse optimizer
(`sparse_sgd`, `sparse_adagrad`, `sparse_rowwise_adagrad`, `sparse_adam`),
whose `apply` updates the touched rows and their per-row moments in place,
in the same compiled program. `jdirect.save_tables` / `restore_tables` checkpoint the table and
the optimizer's state. A jax.Array table (one that fits in device memory)
works with the same functions.
"""

from .embedding import SparseRows, create_table, dedup, lookup
from .optimizers import (SparseOptimizer, SparseState, close, sparse_adagrad, sparse_adam,
                         sparse_rowwise_adagrad, sparse_sgd)

__all__ = ["SparseOptimizer", "SparseRows", "SparseState", "close", "create_table", "dedup",
           "lookup", "sparse_adagrad", "sparse_adam", "sparse_rowwise_adagrad", "sparse_sgd"]
