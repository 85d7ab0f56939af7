"""Where the store lives: one SQL URL for metadata, one root for arrays.

Resolved in one place, in this order: explicit argument (CLI option) >
environment variable > default. The default is an embedded store directory
(`./attnstore-data`) holding `meta.sqlite` and `attention.zarr/`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

ENV_HOME = "ATTNSTORE_HOME"
ENV_DB = "ATTNSTORE_DB"
ENV_ROOT = "ATTNSTORE_ROOT"
ENV_MODELS = "ATTNSTORE_MODELS"
MODELS_NAME = "models"
DEFAULT_HOME = "attnstore-data"
SQLITE_NAME = "meta.sqlite"
ZARR_NAME = "attention.zarr"


@dataclass(frozen=True)
class Locations:
    db_url: str
    array_root: str

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


def resolve_locations(db: str | None = None, root: str | None = None, home: str | None = None) -> Locations:
    """Resolve the database URL and array root: argument > environment > default."""
    home_dir = Path(home or os.environ.get(ENV_HOME) or DEFAULT_HOME)
    db_url = db or os.environ.get(ENV_DB) or f"sqlite:///{(home_dir / SQLITE_NAME).absolute()}"
    array_root = root or os.environ.get(ENV_ROOT) or str((home_dir / ZARR_NAME).absolute())
    if "://" not in db_url:
        # A bare path means a SQLite file: friendlier than a SQLAlchemy URL error.
        db_url = f"sqlite:///{Path(db_url).absolute()}"
    return Locations(db_url=db_url, array_root=array_root)
