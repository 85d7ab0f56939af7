"""Where the store lives: one SQL URL for metadata, one root for arrays.

Resolved in one place, in this order: explicit argument (CLI option) >
environment variable > default. The default is an embedded store directory
(`./attnstore-data`) holding `meta.sqlite` and `attention.zarr/`.

`read_only` (`--read-only` > ATTNSTORE_READ_ONLY=1 > off) opens the store for reading only,
whatever this process could write: for array roots whose write access cannot be tested
cheaply (object storage with read-only credentials), or to make sure nothing is written.
Without it a store is still read-only when its SQLite file, its local array root or its
PostgreSQL tables cannot be written by this user (store/reader.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .errors import InvalidArgumentError

ENV_HOME = "ATTNSTORE_HOME"
ENV_DB = "ATTNSTORE_DB"
ENV_ROOT = "ATTNSTORE_ROOT"
ENV_MODELS = "ATTNSTORE_MODELS"
ENV_READ_ONLY = "ATTNSTORE_READ_ONLY"
MODELS_NAME = "models"
DEFAULT_HOME = "attnstore-data"
SQLITE_NAME = "meta.sqlite"
ZARR_NAME = "attention.zarr"


@dataclass(frozen=True)
class Locations:
    db_url: str
    array_root: str
    read_only: bool = False  # asked for (--read-only, ATTNSTORE_READ_ONLY); see the module docstring

    def describe(self) -> str:
        return f"db={redact(self.db_url)} root={self.array_root}"

    @property
    def models_root(self) -> str:
        """Where fine-tuned checkpoints live: ATTNSTORE_MODELS, else a `models` folder beside the array root.

        The `models` table records checkpoints relative to this folder, so a store copied with
        its folders (or pointed at by a colleague) finds its models.
        """
        if os.environ.get(ENV_MODELS):
            return os.environ[ENV_MODELS]
        root = self.array_root.rstrip("/")
        if "://" in root and not root.startswith("file://"):
            return root.rsplit("/", 1)[0] + "/" + MODELS_NAME
        local = root[len("file://") :] if root.startswith("file://") else root
        return str(Path(local).absolute().parent / MODELS_NAME)


def redact(url: str) -> str:
    """Hide a password in a database URL before printing it."""
    if "://" not in url or "@" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in creds else url


def env_read_only() -> bool:
    """ATTNSTORE_READ_ONLY as a boolean (1/true/yes/on or 0/false/no/off; unset: off)."""
    value = os.environ.get(ENV_READ_ONLY, "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise InvalidArgumentError(f"{ENV_READ_ONLY}={os.environ[ENV_READ_ONLY]!r} is not a boolean; use 1 (read-only) or 0")


def resolve_locations(db: str | None = None, root: str | None = None, home: str | None = None, read_only: bool | None = None) -> Locations:
    """Resolve the database URL, array root and read-only flag: argument > environment > default."""
    home_dir = Path(home or os.environ.get(ENV_HOME) or DEFAULT_HOME)
    db_url = db or os.environ.get(ENV_DB) or f"sqlite:///{(home_dir / SQLITE_NAME).absolute()}"
    array_root = root or os.environ.get(ENV_ROOT) or str((home_dir / ZARR_NAME).absolute())
    if "://" not in db_url:
        # A bare path means a SQLite file: friendlier than a SQLAlchemy URL error.
        db_url = f"sqlite:///{Path(db_url).absolute()}"
    return Locations(db_url=db_url, array_root=array_root, read_only=env_read_only() if read_only is None else bool(read_only))


def root_writable(root: str) -> bool:
    """Whether a local array root can be written (its nearest existing folder); remote roots are assumed writable."""
    if "://" in root and not root.startswith("file://"):
        return True
    path = os.path.abspath(root[len("file://") :] if root.startswith("file://") else root)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return os.access(path, os.W_OK)
