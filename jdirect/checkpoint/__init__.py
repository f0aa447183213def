"""Checkpoints: one file format, one directory layer, for host tables and run state.

- `format.py`: the file (format 2): a pytree whose leaves are jax or NumPy
  arrays or HostTables, every leaf streamed in pieces and hashed (SHA-256);
  a ZIP64 archive of `.npy` members that `np.load` opens. Files of format 1
  (jdirect before this package: `save_tables` files and the trainer's step
  files) are refused in one line naming the format, not read. Its one
  reader accepts only what its writer writes, bounds the header before
  trusting it, and turns every failure into one error (`Damaged`).
- `directory.py`: one writer a directory (flock), removal of what killed
  writers left, and the names jdirect gives its own files (the lock, the
  steps, temporaries), at which nothing but a regular file is ever
  followed or opened; the atomic replace itself (temporary, fsync, read
  back, rename, fsync of the directory; umask honoured) is
  `jdirect._files`', which the metrics file and feature cache use too.
- `tables.py`: `save_tables` / `restore_tables`, one file of host tables
  (a CachedTable restored serves the restored rows).
- `steps.py`: `Checkpoints`, a run's per-epoch steps (rotation of the last
  K, fallback past a damaged newest step); the trainer's `--checkpoint-dir`.
  A run with learned embeddings saves its tables in the same step file.
"""

from .errors import CheckpointError, TableCheckpointError
from .format import FORMAT, read_metadata
from .directory import check_checkpoint_dir
from .steps import Checkpoints, normalised_settings
from .tables import restore_tables, save_tables

__all__ = ["CheckpointError", "Checkpoints", "FORMAT", "TableCheckpointError",
           "check_checkpoint_dir", "normalised_settings", "read_metadata", "restore_tables",
           "save_tables"]
