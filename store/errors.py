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
