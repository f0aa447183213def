"""The checkpoint package's errors (ValueErrors, each message one line)."""


class CheckpointError(ValueError):
    """A checkpoint directory cannot be used: damaged files, a configuration
    or state that differs from the saved one, or a directory that cannot be
    written. The message names the path and what to do."""


class TableCheckpointError(CheckpointError):
    """A table checkpoint (`save_tables`/`restore_tables`) cannot be written
    or used; the message names the file and what differs or is damaged."""


class Damaged(ValueError):
    """A checkpoint file is unreadable, cut, crafted, or differs from its
    hashes; the message says what (not the path: the caller names it)."""


class OldFormat(ValueError):
    """A checkpoint file of a format this jdirect does not read; the message
    names the format."""
