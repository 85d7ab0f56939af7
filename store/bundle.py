"""Portable bundles: export runs (rows, arrays, fine-tuned checkpoints) from one store and import them into another.

`export_runs(store, runs, target)` writes one bundle to a `.zip` file, a new folder, or an fsspec URL
(`s3://bucket/prefix` or `s3://bucket/file.zip`); `import_bundle(store, source)` loads it into any store
(SQLite or PostgreSQL, local or object-storage array root). Layout (docs/SHARING.md, "Export and import"):

    manifest.json                 format "attnstore-bundle" version 1, attnstore version, created_at, source store
                                  (password hidden), schema revision, runs, models, tables (columns, rows), and the
                                  sha256 + size of every other file
    tables/<table>.jsonl.gz       the exported rows of each table, one JSON object per line, with the source's ids
    arrays/<store key>            every Zarr store key under each run's node (its group runs/<slug>/ holding `cells`
                                  and the index arrays, or a layout-1 array runs/<uuid>/), byte for byte (and the
                                  `zarr.json` of the groups above it), so any array layout travels as it is
    models/<checkpoint>/...       fine-tuned checkpoints, relative to the models folder (`models.training.checkpoint`)

A bundle is complete only once `manifest.json` exists: a zip is written as FILE.zip.partial and renamed at
the end; a folder gets its manifest last. Importing checks the format version and every checksum before it
writes anything, refuses a run name that the target uses for another run (ConflictError), copies the arrays
and checkpoints, and then inserts every row in one SQL transaction with new ids (every foreign key remapped).
Importing the same bundle twice changes nothing. Only complete runs are exported.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import hashlib
import json
import os
import shutil
import tempfile
import time
import zipfile
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import sqlalchemy as sa
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

from . import arrays, remote
from .errors import ConflictError, CorruptInputError, InvalidArgumentError, NotFoundError, SchemaOutOfDateError, StorageIOError
from .records import RunInfo
from .schema import Base

if TYPE_CHECKING:
    from .store import Store

FORMAT = "attnstore-bundle"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
# Every table a bundle carries, parents before children (the order rows are inserted in).
TABLE_ORDER = (
    "models",
    "datasets",
    "examples",
    "words",
    "mentions",
    "frames",
    "frame_elements",
    "runs",
    "sequences",
    "tokens",
    "head_metrics",
    "probe_results",
    "pattern_labels",
    "ablation_results",
)
TABLES: dict[str, sa.Table] = {name: Base.metadata.tables[name] for name in TABLE_ORDER}
BATCH_ROWS = 5000  # rows per INSERT batch and per read of the source
BATCH_KEYS = 32  # Zarr keys fetched or stored concurrently (chunks are 2 MiB by default)
BLOCK = 1 << 20


@dataclass(frozen=True)
class ExportReport:
    """What `export_runs` wrote: the target, runs and models exported, files and bytes, seconds taken."""

    target: str
    runs: tuple[str, ...]
    models: tuple[str, ...]
    checkpoints: tuple[str, ...]
    n_rows: int
    n_files: int
    n_bytes: int
    seconds: float


@dataclass(frozen=True)
class ImportReport:
    """What `import_bundle` did: runs imported (names in the target), runs already there, models, rows, bytes copied."""

    source: str
    imported: tuple[str, ...]
    already: tuple[str, ...]  # "NAME" or "NAME (as OTHER)": present in the target before, left as they were
    models: tuple[str, ...]  # models added to the target
    checkpoints: tuple[str, ...]  # checkpoint folders copied into the target's models folder
    datasets_reused: tuple[str, ...]  # datasets the target already held (their examples are shared)
    n_rows: int
    n_bytes: int  # bytes of arrays and checkpoints copied
    seconds: float

    @property
    def changed(self) -> bool:
        return bool(self.imported or self.models or self.checkpoints or self.n_rows)


# ---------------------------------------------------------------------------------------------- locations


def _is_url(location: str) -> bool:
    return "://" in location and not location.startswith("file://")


def _local(location: str) -> str:
    return location[len("file://") :] if location.startswith("file://") else location


def _url_fs(url: str) -> tuple[Any, str]:
    """(filesystem, path) of an fsspec URL; the `s3` extra (fsspec, s3fs) must be installed."""
    if remote.is_s3(url):
        import s3fs  # noqa: F401  ModuleNotFoundError(name="s3fs") -> the CLI's missing-extra line
    from fsspec.core import url_to_fs

    fs, path = url_to_fs(url, **remote.storage_options(url))  # timeouts, no listing cache, the endpoint read now
    return fs, path.rstrip("/")


@contextlib.contextmanager
def _storage_errors(location: str, doing: str) -> Iterator[None]:
    """Failures of object storage holding a bundle (credentials, bucket, endpoint) as one-line attnstore errors."""
    if not _is_url(location):
        yield
        return
    try:
        yield
    except Exception as exc:
        error = remote.translate(exc, location, doing)
        if error is None:
            raise
        raise type(error)(str(error).replace(f"array root {location}", f"bundle {location}")) from None


def _safe_name(name: str, what: str) -> str:
    """A relative POSIX path inside a bundle: no absolute path, no `..`, no empty or odd component."""
    parts = name.split("/")
    if not name or name.startswith("/") or "\\" in name or any(p in ("", ".", "..") for p in parts):
        raise CorruptInputError(f"{what}: {name!r} is not a safe relative path; the bundle is damaged or was not made by attnstore")
    return name


def _hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _fsync(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _io_error(exc: OSError, doing: str) -> StorageIOError:
    return StorageIOError(f"cannot {doing}: {exc.strerror or exc}")


# ---------------------------------------------------------------------------------------------- writing a bundle


class _Sink:
    """Where an export writes: files are hashed as they are written; `commit` writes the manifest, making it whole."""

    def __init__(self, target: str):
        self.target = target
        self.files: dict[str, dict] = {}

    def put(self, name: str, data: bytes) -> None:
        self.files[name] = {"sha256": _hash(data), "size": len(data)}
        with self._open(name) as out:
            out.write(data)

    def put_many(self, items: list[tuple[str, bytes]]) -> None:
        for name, data in items:
            self.put(name, data)

    def put_stream(self, name: str, source: IO[bytes]) -> None:
        digest, size = hashlib.sha256(), 0
        with self._open(name) as out:
            while block := source.read(BLOCK):
                digest.update(block)
                size += len(block)
                out.write(block)
        self.files[name] = {"sha256": digest.hexdigest(), "size": size}

    def _open(self, name: str) -> contextlib.AbstractContextManager[IO[bytes]]:
        raise NotImplementedError

    def commit(self, manifest: bytes) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        raise NotImplementedError


class _ZipSink(_Sink):
    """FILE.zip, written as FILE.zip.partial and renamed once complete (for a URL: uploaded in one piece at the end)."""

    def __init__(self, target: str):
        super().__init__(target)
        self.url = _is_url(target)
        if self.url:
            self.fs, self.path = _url_fs(target)
            if self.fs.exists(self.path):
                raise ConflictError(f"{target} already exists; give another --to, or remove it first")
            fd, self.partial = tempfile.mkstemp(suffix=".zip.partial")
            os.close(fd)
        else:
            self.path = _local(target)
            if os.path.exists(self.path):
                raise ConflictError(f"{self.path} already exists; give another --to, or remove it first")
            self.partial = self.path + ".partial"
            try:
                os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            except OSError as exc:
                raise _io_error(exc, f"create the folder of {self.path}") from None
        try:
            self.zip = zipfile.ZipFile(self.partial, "w", compression=zipfile.ZIP_STORED, allowZip64=True)
        except OSError as exc:
            raise _io_error(exc, f"write {self.partial}") from None
        now = time.localtime()
        self.stamp = (now.tm_year, now.tm_mon, now.tm_mday, now.tm_hour, now.tm_min, now.tm_sec)

    def _info(self, name: str) -> zipfile.ZipInfo:
        info = zipfile.ZipInfo(name, date_time=self.stamp)
        info.compress_type = zipfile.ZIP_STORED  # chunks and .gz tables are compressed already
        return info

    def put(self, name: str, data: bytes) -> None:
        self.files[name] = {"sha256": _hash(data), "size": len(data)}
        self.zip.writestr(self._info(name), data)

    @contextlib.contextmanager
    def _open(self, name: str) -> Iterator[IO[bytes]]:
        with self.zip.open(self._info(name), "w", force_zip64=True) as out:
            yield out

    def commit(self, manifest: bytes) -> None:
        self.zip.writestr(self._info(MANIFEST), manifest)
        self.zip.close()
        _fsync(self.partial)
        if self.url:
            try:
                self.fs.put_file(self.partial, self.path)  # one object appears whole, or not at all
            finally:
                os.remove(self.partial)
        else:
            os.replace(self.partial, self.path)

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self.zip.close()
        with contextlib.suppress(OSError):
            os.remove(self.partial)


class _DirSink(_Sink):
    """A new (or empty) local folder; manifest.json is written last, through a temporary name."""

    def __init__(self, target: str):
        super().__init__(target)
        self.root = Path(_local(target))
        if self.root.exists() and (not self.root.is_dir() or any(self.root.iterdir())):
            raise ConflictError(f"{self.root} already exists and is not an empty folder; give a new folder (or FILE.zip) to --to")
        self.created = not self.root.exists()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _io_error(exc, f"create {self.root}") from None

    @contextlib.contextmanager
    def _open(self, name: str) -> Iterator[IO[bytes]]:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as out:
            yield out

    def commit(self, manifest: bytes) -> None:
        for name in self.files:  # everything on disk before the manifest says the bundle is whole
            _fsync(self.root / name)
        tmp = self.root / (MANIFEST + ".partial")
        tmp.write_bytes(manifest)
        _fsync(tmp)
        os.replace(tmp, self.root / MANIFEST)

    def abort(self) -> None:
        if self.created:
            shutil.rmtree(self.root, ignore_errors=True)
        else:  # it was an empty folder: empty it again
            for child in self.root.iterdir():
                if child.is_dir():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)


class _FsDirSink(_Sink):
    """A prefix of an fsspec filesystem (s3://bucket/bundle): objects first, manifest.json last."""

    def __init__(self, target: str):
        super().__init__(target)
        self.fs, self.path = _url_fs(target)
        if self.fs.exists(self.path) and (not self.fs.isdir(self.path) or self.fs.ls(self.path)):
            raise ConflictError(f"{target} already exists and is not empty; give a new prefix to --to")
        self.written = False

    def _url(self, name: str) -> str:
        return f"{self.path}/{name}"

    def put(self, name: str, data: bytes) -> None:
        self.put_many([(name, data)])

    def put_many(self, items: list[tuple[str, bytes]]) -> None:
        for name, data in items:
            self.files[name] = {"sha256": _hash(data), "size": len(data)}
        self.written = True
        self.fs.pipe({self._url(name): data for name, data in items})  # concurrent uploads on async filesystems

    @contextlib.contextmanager
    def _open(self, name: str) -> Iterator[IO[bytes]]:
        self.written = True
        with self.fs.open(self._url(name), "wb") as out:
            yield out

    def commit(self, manifest: bytes) -> None:
        self.fs.pipe({self._url(MANIFEST): manifest})

    def abort(self) -> None:
        if self.written:
            with contextlib.suppress(Exception):
                self.fs.rm(self.path, recursive=True)


def _open_sink(target: str) -> _Sink:
    if not target:
        raise InvalidArgumentError("give --to FILE.zip, a new folder, or an fsspec URL (s3://bucket/prefix)")
    if target.rstrip("/").endswith(".zip"):
        return _ZipSink(target.rstrip("/"))
    return _FsDirSink(target) if _is_url(target) else _DirSink(target)


# ---------------------------------------------------------------------------------------------- reading a bundle


class Bundle:
    """An opened bundle: its manifest, checked (format, version, every file's sha256) by `open_bundle`."""

    def __init__(self, location: str):
        self.location = location
        self.manifest: dict = {}
        self.verified = False

    # ------------------------------------------------------------ access to files (one per kind of bundle)

    def open(self, name: str) -> IO[bytes]:
        raise NotImplementedError

    def read(self, name: str) -> bytes:
        with self.open(name) as fh:
            return fh.read()

    def read_many(self, names: list[str]) -> list[bytes]:
        return [self.read(n) for n in names]

    def close(self) -> None:
        pass

    def __enter__(self) -> Bundle:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------ contents

    @property
    def files(self) -> dict[str, dict]:
        return self.manifest["files"]

    def names_under(self, prefix: str) -> list[str]:
        return sorted(n for n in self.files if n.startswith(prefix))

    def rows(self, table: str) -> Iterator[dict]:
        """The rows of one table, as the source stored them (DateTime columns parsed back, timezone UTC)."""
        name = f"tables/{table}.jsonl.gz"
        if name not in self.files:
            return
        dates = [c.name for c in TABLES[table].columns if isinstance(c.type, sa.DateTime)]
        with self.open(name) as raw, gzip.open(raw, "rt", encoding="utf-8") as lines:
            for n, line in enumerate(lines, 1):
                try:
                    row = json.loads(line)
                    for col in dates:
                        if row.get(col) is not None:
                            row[col] = datetime.fromisoformat(row[col])
                except (ValueError, TypeError) as exc:
                    raise CorruptInputError(f"bundle {self.location}: {name} line {n} cannot be read ({exc})") from None
                yield row


class _ZipBundle(Bundle):
    def __init__(self, location: str, fileobj: IO[bytes] | None = None):
        super().__init__(location)
        self._fileobj = fileobj
        try:
            self.zip = zipfile.ZipFile(fileobj if fileobj is not None else _local(location))
        except (zipfile.BadZipFile, EOFError) as exc:
            if fileobj is not None:
                fileobj.close()
            raise CorruptInputError(f"{location} is not a readable bundle: {exc} (a damaged or unfinished zip file?)") from None

    def open(self, name: str) -> IO[bytes]:
        return self.zip.open(name)  # KeyError when absent

    def close(self) -> None:
        self.zip.close()
        if self._fileobj is not None:
            self._fileobj.close()


class _DirBundle(Bundle):
    def __init__(self, location: str):
        super().__init__(location)
        self.root = Path(_local(location))

    def open(self, name: str) -> IO[bytes]:
        return open(self.root / name, "rb")


class _FsDirBundle(Bundle):
    def __init__(self, location: str, fs: Any, path: str):
        super().__init__(location)
        self.fs, self.path = fs, path

    def open(self, name: str) -> IO[bytes]:
        return self.fs.open(f"{self.path}/{name}", "rb")

    def read_many(self, names: list[str]) -> list[bytes]:
        urls = [f"{self.path}/{n}" for n in names]
        got = self.fs.cat(urls, on_error="return")
        out = []
        for name, url in zip(names, urls):
            data = got.get(url) if isinstance(got, dict) else None
            if not isinstance(data, bytes):
                raise FileNotFoundError(name)
            out.append(data)
        return out


def _locate(source: str) -> Bundle:
    if _is_url(source):
        fs, path = _url_fs(source)
        if fs.isfile(path):
            return _ZipBundle(source, fs.open(path, "rb"))
        if fs.exists(f"{path}/{MANIFEST}") or fs.isdir(path):
            return _FsDirBundle(source, fs, path)
        raise NotFoundError(f"no bundle at {source}")
    local = Path(_local(source))
    if local.is_dir():
        return _DirBundle(source)
    if local.is_file():
        if not zipfile.is_zipfile(local):
            raise CorruptInputError(f"{local} is not a bundle: neither a zip file nor a folder holding {MANIFEST}")
        return _ZipBundle(source)
    hint = f" ({local}.partial is an export that did not finish)" if Path(f"{local}.partial").exists() else ""
    raise NotFoundError(f"no bundle at {local}{hint}; give the FILE.zip, folder or URL that `attnstore export --to` wrote")


def _read_manifest(bundle: Bundle) -> dict:
    try:
        raw = bundle.read(MANIFEST)
    except (FileNotFoundError, KeyError):
        raise CorruptInputError(
            f"{bundle.location} is not a complete bundle: it has no {MANIFEST} (an export that did not finish?)"
        ) from None
    try:
        manifest = json.loads(raw)
    except ValueError as exc:
        raise CorruptInputError(f"bundle {bundle.location}: {MANIFEST} is not valid JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CorruptInputError(f"{bundle.location} is not an attnstore bundle ({MANIFEST} does not say format {FORMAT!r})")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise InvalidArgumentError(
            f"bundle {bundle.location} has format version {version!r}, written by attnstore "
            f"{manifest.get('attnstore_version', '?')}; this attnstore reads version {FORMAT_VERSION}: "
            "import it with a matching attnstore, or export it again"
        )
    _refuse_newer_schema(bundle, manifest)
    if not isinstance(manifest.get("files"), dict) or not isinstance(manifest.get("runs"), list) or "tables" not in manifest:
        raise CorruptInputError(f"bundle {bundle.location}: {MANIFEST} lacks its files, runs or tables")
    for name in manifest["files"]:
        _safe_name(name, f"bundle {bundle.location}")
    for table, meta in manifest["tables"].items():
        if not isinstance(meta, dict) or meta.get("file") not in manifest["files"]:
            raise CorruptInputError(f"bundle {bundle.location}: {MANIFEST} lists table {table} without its file")
    return manifest


def _refuse_newer_schema(bundle: Bundle, manifest: dict) -> None:
    """A bundle exported from a database at a schema revision this attnstore does not know (a newer attnstore) may hold
    rows and meanings this one would drop or misread: refused, naming both revisions and the fix."""
    from .migrate import head_revision, known_revisions

    revision = manifest.get("schema_revision")
    if revision is None or revision in known_revisions():
        return
    raise SchemaOutOfDateError(
        f"bundle {bundle.location} was exported at schema revision {revision!r} by attnstore "
        f"{manifest.get('attnstore_version', '?')}, newer than this attnstore's (revision {head_revision()!r}, attnstore "
        f"{_attnstore_version()}); upgrade attnstore (pip install -U attnstore) to import it"
    )


def _verify(bundle: Bundle) -> None:
    """Check every file listed in the manifest against its size and sha256 (reads the whole bundle once)."""
    for name, meta in bundle.files.items():
        digest, size = hashlib.sha256(), 0
        try:
            with bundle.open(name) as fh:
                while block := fh.read(BLOCK):
                    digest.update(block)
                    size += len(block)
        except (FileNotFoundError, KeyError):
            raise CorruptInputError(f"damaged bundle {bundle.location}: {name} is missing; export it again") from None
        except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
            raise CorruptInputError(f"damaged bundle {bundle.location}: {name} cannot be read ({exc}); export it again") from None
        if size != meta.get("size") or digest.hexdigest() != meta.get("sha256"):
            raise CorruptInputError(
                f"damaged bundle {bundle.location}: {name} fails its checksum (sha256 {digest.hexdigest()[:16]}..., "
                f"{size} bytes; the manifest says {str(meta.get('sha256'))[:16]}..., {meta.get('size')} bytes); export it again"
            )
    bundle.verified = True


def open_bundle(source: str, verify: bool = True) -> Bundle:
    """Open a bundle (zip file, folder or fsspec URL) and check its format version and every checksum.

    Raises NotFoundError (nothing there), CorruptInputError (not a bundle, a missing or damaged file, named),
    InvalidArgumentError (another format version). Reads only: nothing is written anywhere.
    """
    with _storage_errors(source, "read"):
        bundle = _locate(source)
        try:
            bundle.manifest = _read_manifest(bundle)
            if verify:
                _verify(bundle)
        except BaseException:
            bundle.close()
            raise
    return bundle


# ---------------------------------------------------------------------------------------------- export


def run_uid(manifest: Mapping | None, array_path: str) -> str:
    """A run's identity across stores: its manifest's "uid" when it has one, else its array folder's name."""
    uid = (manifest or {}).get("uid") if isinstance(manifest, Mapping) else None
    return str(uid) if uid else _node(array_path).rsplit("/", 1)[-1]


def _node(array_path: str) -> str:
    """The key prefix holding everything of a run: its group (layout 2: runs/<slug>) or its array (layout 1: runs/<uuid>)."""
    return arrays.run_node_path(array_path.strip("/"))


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)  # SQLite keeps UTC without a zone
        return aware.astimezone(UTC).isoformat()
    raise TypeError(f"cannot write {type(value).__name__} to a bundle")


def _attnstore_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("attnstore")
    except PackageNotFoundError:
        return "unknown"


def _schema_revision(engine: sa.Engine) -> str | None:
    from .migrate import current_revision

    return current_revision(engine)


def _selects(run_ids: list[int], model_ids: list[int], dataset_ids: list[int]) -> dict[str, sa.Select]:
    t = TABLES
    ex, fr = t["examples"], t["frames"]

    def of_datasets(table: sa.Table) -> sa.Select:
        return sa.select(table).join(ex, ex.c.id == table.c.example_id).where(ex.c.dataset_id.in_(dataset_ids)).order_by(table.c.id)

    def of_runs(table: sa.Table, *order) -> sa.Select:
        return sa.select(table).where(table.c.run_id.in_(run_ids)).order_by(*order)

    return {
        "models": sa.select(t["models"]).where(t["models"].c.id.in_(model_ids)).order_by(t["models"].c.id),
        "datasets": sa.select(t["datasets"]).where(t["datasets"].c.id.in_(dataset_ids)).order_by(t["datasets"].c.id),
        "examples": sa.select(ex).where(ex.c.dataset_id.in_(dataset_ids)).order_by(ex.c.id),
        "words": of_datasets(t["words"]),
        "mentions": of_datasets(t["mentions"]),
        "frames": of_datasets(fr),
        "frame_elements": sa.select(t["frame_elements"])
        .join(fr, fr.c.id == t["frame_elements"].c.frame_row_id)
        .join(ex, ex.c.id == fr.c.example_id)
        .where(ex.c.dataset_id.in_(dataset_ids))
        .order_by(t["frame_elements"].c.id),
        "runs": sa.select(t["runs"]).where(t["runs"].c.id.in_(run_ids)).order_by(t["runs"].c.id),
        "sequences": of_runs(t["sequences"], t["sequences"].c.run_id, t["sequences"].c.example_id),
        "tokens": of_runs(t["tokens"], t["tokens"].c.run_id, t["tokens"].c.example_id, t["tokens"].c.position),
        "head_metrics": of_runs(t["head_metrics"], t["head_metrics"].c.id),
        "probe_results": sa.select(t["probe_results"])
        .where(t["probe_results"].c.run_id.in_(run_ids), t["probe_results"].c.eval_run_id.in_(run_ids))
        .order_by(t["probe_results"].c.id),
        "pattern_labels": of_runs(t["pattern_labels"], t["pattern_labels"].c.id),
        "ablation_results": sa.select(t["ablation_results"])
        .where(t["ablation_results"].c.model_id.in_(model_ids))
        .order_by(t["ablation_results"].c.id),
    }


def _write_table(conn: sa.Connection, sink: _Sink, name: str, query: sa.Select) -> int:
    """Stream a table's rows into tables/NAME.jsonl.gz (through a spooled temporary file: memory stays bounded)."""
    n = 0
    with tempfile.SpooledTemporaryFile(max_size=64 << 20) as tmp:
        with gzip.GzipFile(fileobj=tmp, mode="wb", compresslevel=6, mtime=0) as gz:
            result = conn.execution_options(yield_per=BATCH_ROWS).execute(query)
            for row in result.mappings():
                gz.write((json.dumps(dict(row), default=_json_default, ensure_ascii=False, separators=(",", ":")) + "\n").encode())
                n += 1
        tmp.seek(0)
        sink.put_stream(f"tables/{name}.jsonl.gz", tmp)
    return n


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


def export_runs(
    store: Store,
    runs: Iterable[str | int],
    target: str,
    *,
    models: Iterable[str] = (),
    checkpoints: bool = True,
) -> ExportReport:
    """Write `runs` (names or ids; complete runs only) and `models` (names; the most recent of each) to a bundle.

    The bundle holds their rows (models with their parents, datasets with examples, words, mentions and
    frames, runs with sequences and tokens, head_metrics, pattern_labels, probe_results between two exported
    runs, ablation_results of exported models), every array key under each run's array path, and the
    checkpoint folder of each fine-tuned model (unless `checkpoints=False`). `target`: FILE.zip, a new or
    empty folder, or an fsspec URL (s3://bucket/prefix, s3://bucket/FILE.zip). Only reads the store.
    """
    started = time.perf_counter()
    infos: list[RunInfo] = []
    for ref in runs:
        info = store.run_info(ref)
        if info.status != "complete":
            raise InvalidArgumentError(
                f"run {info.name!r} is {info.status}, not complete: only complete runs can be exported "
                "(resume it with its ingest command first)"
            )
        if info.id not in {i.id for i in infos}:
            infos.append(info)
    named_models = []
    for name in models:
        row = store.model_row(name)
        if row is None:
            raise NotFoundError(f"no model {name!r} in {store.locations.describe()}; see `attnstore models`")
        named_models.append(row["id"])
    if not infos and not named_models:
        raise InvalidArgumentError("nothing to export: name at least one --run (or --model)")

    m = TABLES["models"]
    engine = store.engine
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":  # one consistent snapshot of every table
            conn = conn.execution_options(isolation_level="REPEATABLE READ")
        with conn.begin():
            model_ids = {i.model_id for i in infos} | set(named_models)
            frontier = set(model_ids)
            while frontier:  # fine-tuned models bring their parents
                parents = set(conn.scalars(sa.select(m.c.parent_id).where(m.c.id.in_(frontier), m.c.parent_id.is_not(None))))
                frontier = parents - model_ids
                model_ids |= parents
            model_rows = [dict(r) for r in conn.execute(sa.select(m).where(m.c.id.in_(model_ids)).order_by(m.c.id)).mappings()]
            ckpts: dict[str, list[tuple[str, str]]] = {}
            for row in model_rows:
                checkpoint = (row.get("training") or {}).get("checkpoint")
                if checkpoint and checkpoints:
                    _safe_name(str(checkpoint), f"model {row['name']!r}")
                    files = _checkpoint_files(store, str(checkpoint))
                    if not files:
                        raise NotFoundError(
                            f"the checkpoint of model {row['name']!r} is not at {store.locations.models_root}/{checkpoint}; "
                            "copy the store's models folder (or set ATTNSTORE_MODELS), or export with --no-checkpoints"
                        )
                    ckpts[str(checkpoint)] = files
            run_ids = sorted(i.id for i in infos)
            dataset_ids = sorted({i.dataset_id for i in infos})
            source_root = arrays.open_root(store.locations.array_root, read_only=True)
            array_keys = {}
            for info in infos:
                # Not the temporary files of writers that were killed (`<key>.<hex>.partial`): never data of the run.
                keys = [k for k in _zarr_keys(source_root, _node(info.array_path) + "/") if not arrays.PARTIAL_FILE.search(k)]
                if f"{info.array_path.rstrip('/')}/zarr.json" not in keys:
                    raise NotFoundError(
                        f"the attention array of run {info.name!r} ({info.array_path}) is not under {store.locations.array_root}; "
                        "is --root the store's array root?"
                    )
                array_keys[info.id] = keys

            with _storage_errors(target, "write"):
                sink = _open_sink(target)
                try:
                    tables, n_rows = {}, 0
                    for name, query in _selects(run_ids, sorted(model_ids), dataset_ids).items():
                        n = _write_table(conn, sink, name, query)
                        tables[name] = {"file": f"tables/{name}.jsonl.gz", "rows": n, "columns": [c.name for c in TABLES[name].columns]}
                        n_rows += n
                    run_entries = []
                    groups: set[str] = set()
                    for info in infos:
                        keys = array_keys[info.id]
                        n_bytes = 0
                        for i in range(0, len(keys), BATCH_KEYS):
                            batch = keys[i : i + BATCH_KEYS]
                            items = []
                            for key, data in zip(batch, _zarr_get(source_root, batch)):
                                if data is None:
                                    raise StorageIOError(f"key {key} of run {info.name!r} vanished while it was exported; export again")
                                items.append((f"arrays/{key}", data))
                                n_bytes += len(data)
                            sink.put_many(items)
                        for key in _ancestors(_node(info.array_path)):
                            if key not in groups and f"arrays/{key}" not in sink.files:
                                groups.add(key)
                                (data,) = _zarr_get(source_root, [key])
                                if data is not None:
                                    sink.put(f"arrays/{key}", data)
                        model = next(r for r in model_rows if r["id"] == info.model_id)
                        run_entries.append(
                            dict(
                                name=info.name,
                                uid=run_uid(info.manifest, info.array_path),
                                model=info.model,
                                model_sha256=model["weights_sha256"],
                                dataset=info.dataset,
                                split=info.split,
                                array_path=info.array_path,
                                array_prefix=_node(info.array_path),
                                n_stored=info.n_stored,
                                array_keys=len(keys),
                                array_bytes=n_bytes,
                            )
                        )
                    for checkpoint, files in ckpts.items():
                        for rel, path in files:
                            with _open_checkpoint_file(store, path) as fh:
                                sink.put_stream(f"models/{checkpoint}/{rel}", fh)
                    manifest = dict(
                        format=FORMAT,
                        format_version=FORMAT_VERSION,
                        attnstore_version=_attnstore_version(),
                        created_at=datetime.now(UTC).isoformat(),
                        source=store.locations.describe(),
                        schema_revision=_schema_revision(engine),
                        runs=run_entries,
                        models=[
                            dict(
                                name=r["name"],
                                weights_sha256=r["weights_sha256"],
                                init=r.get("init"),
                                task=r.get("task"),
                                checkpoint=(r.get("training") or {}).get("checkpoint") if checkpoints else None,
                            )
                            for r in model_rows
                        ],
                        tables=tables,
                        files=sink.files,
                    )
                    sink.commit(json.dumps(manifest, indent=1, ensure_ascii=False, default=_json_default).encode())
                except OSError as exc:
                    sink.abort()
                    raise _io_error(exc, f"write the bundle {target}") from None
                except BaseException:
                    sink.abort()
                    raise
    n_bytes = sum(f["size"] for f in sink.files.values())
    return ExportReport(
        target=target,
        runs=tuple(i.name for i in infos),
        models=tuple(r["name"] for r in model_rows),
        checkpoints=tuple(ckpts),
        n_rows=n_rows,
        n_files=len(sink.files) + 1,
        n_bytes=n_bytes,
        seconds=time.perf_counter() - started,
    )


# ---------------------------------------------------------------------------------------------- import


@dataclass
class _Plan:
    runs: list[dict]  # bundle rows of the runs to import
    array_paths: dict[int, str]  # bundle run id -> its array path in the target (the same unless a layout-2 run is renamed)
    already: list[str]
    run_map: dict[int, int]  # bundle run id -> target run id (runs already in the target)
    model_map: dict[int, int]  # bundle model id -> target model id (models already in the target)
    new_models: list[dict]  # parents first
    dataset_map: dict[int, int]  # bundle dataset id -> target dataset id (datasets reused)
    new_datasets: list[dict]
    reused_positions: dict[int, dict[int, int]]  # bundle dataset id -> {position: target example id}
    reused_names: list[str]  # NAME:SPLIT of the datasets reused
    checkpoints: list[str]  # checkpoint folders to copy
    ablation: list[dict]  # bundle ablation rows not yet in the target


def _parents_first(models: list[dict]) -> list[dict]:
    by_id = {m["id"]: m for m in models}
    ordered: list[dict] = []
    seen: set[int] = set()

    def visit(m: dict, depth: int = 0) -> None:
        if m["id"] in seen or depth > len(models):
            return
        parent = by_id.get(m.get("parent_id"))
        if parent is not None:
            visit(parent, depth + 1)
        seen.add(m["id"])
        ordered.append(m)

    for m in models:
        visit(m)
    return ordered


def _target_checkpoint_state(store: Store, bundle: Bundle, checkpoint: str) -> str:
    """ "absent", "same" (every bundle file present with equal bytes) or "different" in the target's models folder."""
    present = dict(_checkpoint_files(store, checkpoint))
    if not present:
        return "absent"
    for name in bundle.names_under(f"models/{checkpoint}/"):
        rel = name[len(f"models/{checkpoint}/") :]
        if rel not in present:
            return "different"
        digest = hashlib.sha256()
        with _open_checkpoint_file(store, present[rel]) as fh:
            while block := fh.read(BLOCK):
                digest.update(block)
        if digest.hexdigest() != bundle.files[name]["sha256"]:
            return "different"
    return "same"


def _plan(store: Store, bundle: Bundle, rename: Mapping[str, str]) -> _Plan:
    from .writer import validate_run_name

    t = TABLES
    runs = list(bundle.rows("runs"))
    known = {r["name"] for r in runs}
    unknown = sorted(set(rename) - known)
    if unknown:
        raise InvalidArgumentError(f"--rename {unknown[0]}=...: the bundle has no run {unknown[0]!r} (it holds {', '.join(sorted(known))})")
    for table, meta in bundle.manifest["tables"].items():
        extra = set(meta.get("columns", [])) - {c.name for c in TABLES[table].columns} if table in TABLES else {"*"}
        if extra:
            raise InvalidArgumentError(
                f"bundle {bundle.location} was written by attnstore {bundle.manifest.get('attnstore_version')} "
                f"(schema {bundle.manifest.get('schema_revision')}) with table data this attnstore does not know "
                f"({table}: {', '.join(sorted(extra))}); upgrade attnstore to import it"
            )
    describe = store.locations.describe()
    with store.engine.connect() as conn:
        stored = conn.execute(sa.select(t["runs"].c.id, t["runs"].c.name, t["runs"].c.array_path, t["runs"].c.manifest)).all()
        by_uid = {run_uid(r.manifest, r.array_path): r for r in stored}
        by_name = {r.name: r for r in stored}
        by_node = {_node(r.array_path): r for r in stored}
        todo, already, run_map, array_paths = [], [], {}, {}
        for r in runs:
            name = rename.get(r["name"], r["name"])
            uid = run_uid(r["manifest"], r["array_path"])
            _safe_name(r["array_path"], f"run {r['name']!r}")
            hit = by_uid.get(uid)
            if hit is not None:
                already.append(r["name"] if hit.name == r["name"] else f"{r['name']} (as {hit.name})")
                run_map[r["id"]] = hit.id
                continue
            if name in by_name:
                other = by_name[name]
                raise ConflictError(
                    f"run {name!r} already exists in {describe} as another run (uid {run_uid(other.manifest, other.array_path)}, "
                    f"the bundle's is {uid}); import it under another name with --rename {r['name']}=NEW_NAME, or drop the stored run"
                )
            validate_run_name(name)
            # A layout-2 run's group is named after the run (runs/<slug>): a renamed run moves to its new name's group.
            path = r["array_path"]
            if name != r["name"] and arrays.group_path_of(path):
                path = f"{arrays.run_group_path(name)}/{arrays.CELLS}"
            if _node(path) in by_node:
                raise ConflictError(
                    f"run {name!r}: its arrays would go to {_node(path)}, which run {by_node[_node(path)].name!r} uses "
                    f"in {describe}; import it under another name with --rename {r['name']}=NEW_NAME"
                )
            array_paths[r["id"]] = path
            todo.append(r)
        if len({rename.get(r["name"], r["name"]) for r in todo}) < len(todo) or len({_node(p) for p in array_paths.values()}) < len(todo):
            raise InvalidArgumentError("--rename gives two runs of the bundle the same name")

        m = t["models"]
        model_map, new_models = {}, []
        for row in _parents_first(list(bundle.rows("models"))):
            found = conn.scalar(sa.select(m.c.id).where(m.c.name == row["name"], m.c.weights_sha256 == row["weights_sha256"]))
            if found is not None:
                model_map[row["id"]] = found
            else:
                new_models.append(row)

        checkpoints = []
        for entry in bundle.manifest.get("models", []):
            checkpoint = entry.get("checkpoint")
            if not checkpoint or not bundle.names_under(f"models/{checkpoint}/"):
                continue
            _safe_name(checkpoint, f"model {entry['name']!r}")
            state = _target_checkpoint_state(store, bundle, checkpoint)
            is_new = any(r["name"] == entry["name"] and r["weights_sha256"] == entry["weights_sha256"] for r in new_models)
            if state == "absent":
                checkpoints.append(checkpoint)
            elif state == "different" and is_new:
                raise ConflictError(
                    f"model {entry['name']!r}: the models folder {store.locations.models_root} already holds another "
                    f"checkpoint named {checkpoint!r}; move it away (or set ATTNSTORE_MODELS) and import again"
                )

        ex = t["examples"]
        wanted = {r["dataset_id"] for r in todo}
        dataset_map, new_datasets, reused, reused_names = {}, [], {}, []
        bundle_positions: dict[int, set[int]] = {}
        for row in bundle.rows("datasets"):
            if row["id"] not in wanted:
                continue
            row["identity"] = _dataset_identity(row)
            found = _find_dataset(conn, row)
            if found is None:
                new_datasets.append(row)
                continue
            if found.status != "complete":
                raise ConflictError(
                    f"dataset {row['name']}:{row['split']} is still being loaded in {describe} (status {found.status}); "
                    "let that ingest finish (or resume it), then import again"
                )
            dataset_map[row["id"]] = found.id
            reused_names.append(f"{row['name']}:{row['split']}")
            reused[row["id"]] = {
                int(p): int(i) for i, p in conn.execute(sa.select(ex.c.id, ex.c.position).where(ex.c.dataset_id == found.id))
            }
            bundle_positions[row["id"]] = set()
        if reused:
            for row in bundle.rows("examples"):
                if row["dataset_id"] in bundle_positions:
                    bundle_positions[row["dataset_id"]].add(row["position"])
            for ds, positions in bundle_positions.items():
                if positions != set(reused[ds]):
                    name = next(r["name"] for r in bundle.rows("datasets") if r["id"] == ds)
                    raise ConflictError(
                        f"dataset {name!r} exists in {describe} with the same file checksum but other examples "
                        f"({len(reused[ds])} stored, {len(positions)} in the bundle); the bundle cannot be imported here"
                    )

        a = t["ablation_results"]
        ablation = []
        key_cols = ("task", "split", "mode", "config", "metric")
        existing_keys: dict[int, set[tuple]] = {}
        for row in bundle.rows("ablation_results"):
            target_model = model_map.get(row["model_id"])
            if target_model is not None:
                if target_model not in existing_keys:
                    existing_keys[target_model] = {
                        tuple(k) for k in conn.execute(sa.select(*(a.c[c] for c in key_cols)).where(a.c.model_id == target_model))
                    }
                if tuple(row[c] for c in key_cols) in existing_keys[target_model]:
                    continue
            ablation.append(row)
    return _Plan(
        runs=todo,
        array_paths=array_paths,
        already=already,
        run_map=run_map,
        model_map=model_map,
        new_models=new_models,
        dataset_map=dataset_map,
        new_datasets=new_datasets,
        reused_positions=reused,
        reused_names=reused_names,
        checkpoints=checkpoints,
        ablation=ablation,
    )


def _dataset_identity(row: dict) -> str | None:
    """A bundled dataset's identity (store/identity.py): as stored, or recomputed for a bundle made before revision 0009."""
    if row.get("identity") or "identity" not in TABLES["datasets"].columns:
        return row.get("identity")
    from .identity import dataset_identity

    return dataset_identity(checksum=row["checksum"], format=row["format"], options=row.get("options"), annotator=row["annotator"])


def _find_dataset(conn: sa.Connection, row: dict) -> Any:
    """The target's dataset holding the same examples: same identity (content, format, options, selection, annotator
    kind; a complete one first), or for a schema without identities, the same name, split and checksum."""
    d = TABLES["datasets"]
    if "identity" in d.columns:
        where = d.c.identity == row["identity"]
    else:
        where = sa.and_(d.c.name == row["name"], d.c.split == row["split"], d.c.checksum == row["checksum"])
    order = (sa.case((d.c.status == "complete", 0), else_=1), d.c.id)
    return conn.execute(sa.select(d.c.id, d.c.status).where(where).order_by(*order).limit(1)).first()


def _copy_arrays(store: Store, bundle: Bundle, plan: _Plan, rename: Mapping[str, str]) -> int:
    """Copy every key of the runs' nodes into the target root (rechecking each sha256), and missing group metadata."""
    root = arrays.open_root(store.locations.array_root, read_only=False)
    copied = 0
    for run in plan.runs:
        source, target = _node(run["array_path"]) + "/", _node(plan.array_paths[run["id"]]) + "/"
        names = [n for n in bundle.names_under(f"arrays/{source}") if not arrays.PARTIAL_FILE.search(n)]  # older exports had them
        keys = {target + n[len(f"arrays/{source}") :] for n in names}
        stale = [k for k in _zarr_keys(root, target) if k not in keys]  # left by an import that failed before its rows
        if stale:
            _zarr_delete(root, stale)
        renamed = rename.get(run["name"], run["name"]) if source != target else None
        for i in range(0, len(names), BATCH_KEYS):
            batch = names[i : i + BATCH_KEYS]
            items = []
            for name, data in zip(batch, bundle.read_many(batch)):
                if _hash(data) != bundle.files[name]["sha256"]:
                    raise CorruptInputError(f"damaged bundle {bundle.location}: {name} changed while it was imported; import again")
                key = target + name[len(f"arrays/{source}") :]
                if renamed and key == f"{target}zarr.json":  # the renamed run's group says its new name
                    meta = json.loads(data)
                    if isinstance(meta.get("attributes"), dict) and "run" in meta["attributes"]:
                        meta["attributes"]["run"] = renamed
                        data = json.dumps(meta, indent=2).encode()
                items.append((key, data))
                copied += len(data)
            _zarr_set(root, items)
        for key in _ancestors(target):
            name = f"arrays/{key}"
            if name in bundle.files and _zarr_get(root, [key]) == [None]:
                _zarr_set(root, [(key, bundle.read(name))])
    return copied


def _copy_checkpoints(store: Store, bundle: Bundle, checkpoints: list[str]) -> int:
    """Copy checkpoint folders into the target's models folder (a local folder appears whole, by rename)."""
    fs, root = _models_location(store)
    copied = 0
    for checkpoint in checkpoints:
        names = bundle.names_under(f"models/{checkpoint}/")
        if fs is None:
            final = Path(root) / checkpoint
            partial = final.with_name(final.name + ".partial-import")
            shutil.rmtree(partial, ignore_errors=True)
            for name in names:
                path = partial / name[len(f"models/{checkpoint}/") :]
                path.parent.mkdir(parents=True, exist_ok=True)
                with bundle.open(name) as src, open(path, "wb") as out:
                    shutil.copyfileobj(src, out, BLOCK)
                copied += bundle.files[name]["size"]
            if final.exists():  # an empty or partly copied folder left by an interrupted import
                shutil.rmtree(final)
            os.replace(partial, final)
        else:
            for name in names:
                with bundle.open(name) as src, fs.open(f"{root}/{checkpoint}/{name[len(f'models/{checkpoint}/') :]}", "wb") as out:
                    shutil.copyfileobj(src, out, BLOCK)
                copied += bundle.files[name]["size"]
    return copied


def _without_id(row: dict) -> dict:
    return {k: v for k, v in row.items() if k != "id"}


def _batches(rows: Iterable[dict], size: int = BATCH_ROWS) -> Iterator[list[dict]]:
    batch: list[dict] = []
    for row in rows:
        batch.append(row)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def _columns(table: str, row: dict) -> dict:
    """Only the columns the target's table has (a bundle from an older schema lacks some: their defaults apply)."""
    names = TABLES[table].columns.keys()
    return {k: v for k, v in row.items() if k in names}


def _insert_rows(conn: sa.Connection, plan: _Plan, bundle: Bundle, rename: Mapping[str, str]) -> tuple[list[str], int]:
    """Every row of the plan, in one transaction (the caller's), with new ids; returns (new model names, rows)."""
    t = TABLES
    n = 0
    model_map = dict(plan.model_map)
    added_models = []
    for row in plan.new_models:
        values = _columns("models", _without_id(row))
        if row.get("parent_id") is not None:
            values["parent_id"] = model_map[row["parent_id"]]
        model_map[row["id"]] = conn.execute(sa.insert(t["models"]).values(**values).returning(t["models"].c.id)).scalar_one()
        added_models.append(row["name"])
        n += 1
    dataset_map = dict(plan.dataset_map)
    for row in plan.new_datasets:
        values = _columns("datasets", _without_id(row))
        dataset_map[row["id"]] = conn.execute(sa.insert(t["datasets"]).values(**values).returning(t["datasets"].c.id)).scalar_one()
        n += 1
    new_ds = {row["id"] for row in plan.new_datasets}
    example_map: dict[int, int] = {}  # bundle example id -> target example id
    fresh_ids: set[int] = set()  # bundle example ids inserted now (their words, mentions and frames come too)
    if plan.runs:
        for batch in _batches(r for r in bundle.rows("examples") if r["dataset_id"] in dataset_map):
            fresh = [r for r in batch if r["dataset_id"] in new_ds]
            for r in batch:
                if r["dataset_id"] not in new_ds:
                    example_map[r["id"]] = plan.reused_positions[r["dataset_id"]][r["position"]]
            if fresh:
                rows = [dict(_columns("examples", _without_id(r)), dataset_id=dataset_map[r["dataset_id"]]) for r in fresh]
                ids = conn.execute(sa.insert(t["examples"]).returning(t["examples"].c.id, sort_by_parameter_order=True), rows).scalars()
                example_map.update(zip((r["id"] for r in fresh), ids))
                fresh_ids.update(r["id"] for r in fresh)
                n += len(fresh)

    def example_rows(table: str) -> Iterator[dict]:
        for r in bundle.rows(table):
            if r["example_id"] in fresh_ids:
                yield dict(_columns(table, _without_id(r)), example_id=example_map[r["example_id"]])

    for table in ("words", "mentions"):
        for batch in _batches(example_rows(table)):
            conn.execute(sa.insert(t[table]), batch)
            n += len(batch)
    frame_map: dict[int, int] = {}
    for batch in _batches(r for r in bundle.rows("frames") if r["example_id"] in fresh_ids):
        frame_values = [dict(_columns("frames", _without_id(r)), example_id=example_map[r["example_id"]]) for r in batch]
        ids = conn.execute(sa.insert(t["frames"]).returning(t["frames"].c.id, sort_by_parameter_order=True), frame_values).scalars()
        frame_map.update(zip((r["id"] for r in batch), ids))
        n += len(batch)
    elements = (
        dict(_columns("frame_elements", _without_id(r)), frame_row_id=frame_map[r["frame_row_id"]])
        for r in bundle.rows("frame_elements")
        if r["frame_row_id"] in frame_map
    )
    for batch in _batches(elements):
        conn.execute(sa.insert(t["frame_elements"]), batch)
        n += len(batch)

    run_map = dict(plan.run_map)
    todo = {r["id"] for r in plan.runs}
    for row in plan.runs:
        values = _columns("runs", _without_id(row))
        values.update(
            name=rename.get(row["name"], row["name"]),
            model_id=model_map[row["model_id"]],
            dataset_id=dataset_map[row["dataset_id"]],
            array_path=plan.array_paths[row["id"]],
        )
        run_map[row["id"]] = conn.execute(sa.insert(t["runs"]).values(**values).returning(t["runs"].c.id)).scalar_one()
        n += 1

    def run_rows(table: str, has_example: bool) -> Iterator[dict]:
        for r in bundle.rows(table):
            if r["run_id"] in todo:
                values = dict(_columns(table, _without_id(r)), run_id=run_map[r["run_id"]])
                if has_example:
                    if r["example_id"] not in example_map:
                        raise CorruptInputError(
                            f"bundle {bundle.location}: {table} refers to example id {r['example_id']}, not in the bundle"
                        )
                    values["example_id"] = example_map[r["example_id"]]
                yield values

    for table, has_example in (("sequences", True), ("tokens", True), ("head_metrics", False), ("pattern_labels", True)):
        for batch in _batches(run_rows(table, has_example)):
            conn.execute(sa.insert(t[table]), batch)
            n += len(batch)
    probes = [
        dict(_columns("probe_results", _without_id(r)), run_id=run_map[r["run_id"]], eval_run_id=run_map[r["eval_run_id"]])
        for r in bundle.rows("probe_results")
        if (r["run_id"] in todo or r["eval_run_id"] in todo) and r["run_id"] in run_map and r["eval_run_id"] in run_map
    ]
    if probes:
        conn.execute(sa.insert(t["probe_results"]), probes)
        n += len(probes)
    ablation = [dict(_columns("ablation_results", _without_id(r)), model_id=model_map[r["model_id"]]) for r in plan.ablation]
    for batch in _batches(ablation):
        conn.execute(sa.insert(t["ablation_results"]), batch)
        n += len(batch)
    return added_models, n


def _has_work(plan: _Plan) -> bool:
    return bool(plan.runs or plan.new_models or plan.checkpoints or plan.ablation)


def import_bundle(store: Store, source: str | Bundle, *, rename: Mapping[str, str] | None = None) -> ImportReport:
    """Load a bundle into `store`: verify it whole, then copy arrays and checkpoints, then insert every row in one transaction.

    `source`: a path or URL (opened and verified here) or a `Bundle` from `open_bundle`. Runs already in
    the store (same uid) are left as they are, so importing twice is a no-op. A run whose name the store
    uses for another run raises ConflictError before anything is written; `rename` ({old: new}) imports
    it under another name. Datasets the store already holds (name, split, checksum) are reused: the
    runs' examples map onto the stored ones by position. Models are matched by (name, weights sha256).
    """
    from .identity import dataset_lease_name
    from .writer import run_lease_name

    started = time.perf_counter()
    rename = dict(rename or {})
    bundle = source if isinstance(source, Bundle) else open_bundle(source)
    try:
        if not bundle.verified:
            _verify(bundle)
        store.require_writable()
        plan = _plan(store, bundle, rename)
        if not _has_work(plan):
            return ImportReport(bundle.location, (), tuple(plan.already), (), (), (), 0, 0, time.perf_counter() - started)
        with contextlib.ExitStack() as leases:
            # The leases ingest takes too: no ingest (or other import) creates these runs or loads these datasets now.
            for name in sorted(rename.get(r["name"], r["name"]) for r in plan.runs):
                leases.enter_context(store.lease(run_lease_name(name), f"run {name!r}"))
            for row in sorted(plan.new_datasets, key=lambda r: str(r.get("identity"))):
                if row.get("identity"):
                    what = f"dataset {row['name']}:{row['split']}"
                    leases.enter_context(store.lease(dataset_lease_name(row["identity"]), what, wait=True))
            plan = _plan(store, bundle, rename)  # again, under the leases: what another process did meanwhile counts
            if not _has_work(plan):
                return ImportReport(bundle.location, (), tuple(plan.already), (), (), (), 0, 0, time.perf_counter() - started)
            try:
                with _storage_errors(bundle.location, "read"):
                    copied = _copy_arrays(store, bundle, plan, rename)
                    copied += _copy_checkpoints(store, bundle, plan.checkpoints)
            except OSError as exc:
                raise _io_error(exc, f"copy the bundle's files into {store.locations.array_root}") from None
            with store.session() as session:
                added, n_rows = _insert_rows(session.connection(), plan, bundle, rename)
    finally:
        if not isinstance(source, Bundle):
            bundle.close()
    return ImportReport(
        source=bundle.location,
        imported=tuple(rename.get(r["name"], r["name"]) for r in plan.runs),
        already=tuple(plan.already),
        models=tuple(added),
        checkpoints=tuple(plan.checkpoints),
        datasets_reused=tuple(plan.reused_names),
        n_rows=n_rows,
        n_bytes=copied,
        seconds=time.perf_counter() - started,
    )


__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "Bundle",
    "ExportReport",
    "ImportReport",
    "export_runs",
    "import_bundle",
    "open_bundle",
    "run_uid",
]
