"""jdirect: GPU-centric access to host-memory tables for JAX.

`gather(table, idx)` is `jnp.take(table, idx, axis=0)` whose rows are read
where the table lives: GPU threads read a `HostTable` (or a `pinned_host`
jax.Array) directly over PCIe, with no staging copy. `host_empty` allocates
host memory where those reads are fastest. `write_rows(table, idx, rows)`
(`table.at[idx].set/add`) writes rows back into a HostTable in place;
`jdirect.embeddings` trains embedding tables whose rows live in host
memory; `neighbor_sum(table, indptr, indices)` sums each node's neighbours'
rows over a CSR in one kernel (full-graph GNN layers); `save_tables` and
`restore_tables` checkpoint host tables in pieces.
"""

from . import _ffi  # registers the FFI targets
from .async_gather import Pending, gather_done, gather_start
from .cached_table import CachedTable
from .environment import build_info
from .gather import gather
from .host_memory import host_empty
from .host_table import HostTable
from .neighbor_sum import neighbor_sum
from .partitioned_cache import PartitionedCache
from .quantized import Int8Table, decode_rows, quantize_rows
from .placement import replicated
from .table import Table
from .checkpoint import TableCheckpointError, restore_tables, save_tables
from .write import write_rows
from . import embeddings  # after the table kinds and writes it builds on

__all__ = ["CachedTable", "HostTable", "Int8Table", "PartitionedCache", "Pending", "Table",
           "TableCheckpointError", "build_info", "decode_rows", "embeddings", "gather",
           "gather_done", "gather_start", "has_cuda", "host_empty", "neighbor_sum",
           "quantize_rows", "replicated", "restore_tables", "save_tables", "write_rows"]

has_cuda = _ffi.has_cuda
__version__ = "0.1.0"
