"""The files of a store that a bundle carries, read on export and written on import: the Zarr keys under each
run's node of the array root, and the checkpoint folders in the store's models folder (local or fsspec URL)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

from .. import arrays
from .container import _is_url, _local, _url_fs

if TYPE_CHECKING:
    from ..store import Store


def run_uid(manifest: Mapping | None, array_path: str) -> str:
    """A run's identity across stores: its manifest's "uid" when it has one, else its group's name."""
    uid = (manifest or {}).get("uid") if isinstance(manifest, Mapping) else None
    return str(uid) if uid else _node(array_path).rsplit("/", 1)[-1]


def _node(array_path: str) -> str:
    """The key prefix holding everything of a run: its group (runs/<slug>)."""
    return arrays.group_path_of(array_path)


def _zarr_keys(zstore: Any, prefix: str) -> list[str]:
    async def listing() -> list[str]:
        return [key async for key in zstore.list_prefix(prefix)]

    return sorted(sync(listing()))


def _zarr_get(zstore: Any, keys: list[str]) -> list[bytes | None]:
    prototype = default_buffer_prototype()

    async def fetch() -> list:
        return await asyncio.gather(*(zstore.get(k, prototype=prototype) for k in keys))

    return [None if b is None else b.to_bytes() for b in sync(fetch())]


def _zarr_set(zstore: Any, items: list[tuple[str, bytes]]) -> None:
    prototype = default_buffer_prototype()

    async def store_all() -> None:
        await asyncio.gather(*(zstore.set(k, prototype.buffer.from_bytes(data)) for k, data in items))

    sync(store_all())


def _zarr_delete(zstore: Any, keys: list[str]) -> None:
    async def delete_all() -> None:
        await asyncio.gather(*(zstore.delete(k) for k in keys))

    sync(delete_all())


def _zarr_delete_dir(zstore: Any, prefix: str) -> None:
    """Remove what is left under `prefix` (the empty folders of a local root)."""
    sync(zstore.delete_dir(prefix))


def _ancestors(node: str) -> list[str]:
    """The group metadata keys above a run's node: zarr.json, runs/zarr.json for runs/<slug>."""
    parts = node.strip("/").split("/")[:-1]
    return ["zarr.json"] + [f"{'/'.join(parts[: i + 1])}/zarr.json" for i in range(len(parts))]


def _models_location(store: Store) -> tuple[Any, str]:
    """(fsspec filesystem or None for a local folder, path) of the store's models folder."""
    root = store.locations.models_root
    if _is_url(root):
        return _url_fs(root)
    return None, _local(root)


def _checkpoint_files(store: Store, checkpoint: str) -> list[tuple[str, str]]:
    """(path relative to the checkpoint, absolute path or URL) of every file of a checkpoint folder; [] if absent."""
    fs, root = _models_location(store)
    folder = f"{root.rstrip('/')}/{checkpoint}"
    if fs is None:
        base = Path(folder)
        if not base.is_dir():
            return []
        return sorted((p.relative_to(base).as_posix(), str(p)) for p in base.rglob("*") if p.is_file())
    if not fs.isdir(folder):
        return []
    return sorted((path[len(folder) + 1 :], path) for path in fs.find(folder))


def _open_checkpoint_file(store: Store, path: str) -> IO[bytes]:
    fs, _ = _models_location(store)
    return open(path, "rb") if fs is None else fs.open(path, "rb")
