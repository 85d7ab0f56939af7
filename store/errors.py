"""Errors raised by the store. Every error attnstore raises derives from `AttnStoreError`."""


class AttnStoreError(Exception):
    """Base class of every attnstore error; its message is one line a user can act on."""


class NotFoundError(AttnStoreError, FileNotFoundError):
    """A run, example, model, file or query that does not exist."""


class InvalidArgumentError(AttnStoreError, ValueError):
    """An argument that is well-formed but not acceptable (bad layer index, bad option)."""


class SchemaOutOfDateError(AttnStoreError):
    """The database schema is older (or newer) than this version of attnstore expects."""


class CorruptInputError(AttnStoreError, ValueError):
    """Input data (a corpus file, a stored array) that cannot be read as it should."""


class ConflictError(AttnStoreError):
    """A write that would contradict what is already stored (e.g. a run name reused for another model)."""


class BusyError(ConflictError):
    """Another live process is writing this run (or loading this dataset) right now."""


class LeaseLostError(ConflictError):
    """This process's write lease was taken over (it stalled past the stale period); it must stop writing."""


class StorageIOError(AttnStoreError, OSError):
    """Reading or writing the array root or database failed at the operating-system level (disk full, permissions)."""


class ReadOnlyStoreError(AttnStoreError, PermissionError):
    """A write was asked of a store opened read-only (no write permission on its database or array root)."""


class OldLayoutError(InvalidArgumentError):
    """A run whose arrays are still in Zarr layout 1 (a bare array at runs/<uuid>, written before 2026-11-23), which this
    version no longer reads or writes; `attnstore db upgrade-arrays` converts them (store/layout.py)."""


class TooLargeError(InvalidArgumentError):
    """A request over a bound (cells per response, examples per query, bytes of a SQL result): HTTP 413."""


class DamagedDataError(CorruptInputError):
    """Stored attention data fails its checks: a missing, truncated or corrupted chunk, or inconsistent metadata."""


class IncompleteRunWarning(UserWarning):
    """A query read a run that is still being written or was interrupted: results cover only its stored examples."""
