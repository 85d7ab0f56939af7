"""Where a bundle lives: a `.zip` file, a local folder, or an fsspec URL (a prefix or a zip object on object storage).

Writing goes through a sink (`_open_sink`): `_ZipSink` (FILE.zip, written as FILE.zip.partial and renamed, or
uploaded in one piece for a URL), `_DirSink` (a new or empty local folder) and `_FsDirSink` (an object-storage
prefix). Reading goes through a `Bundle` (`open_bundle`, which finds the kind with `_locate`): `_ZipBundle`,
`_DirBundle` and `_FsDirBundle`.

The eight classes stay separate on purpose; one implementation over fsspec for zip, folder and object
storage would change behaviour or performance:
- fsspec is an optional dependency (the `s3` extra); local zip files and folders need only the standard library.
- each kind makes a bundle appear whole its own way: a local zip is fsynced and renamed from FILE.zip.partial,
  a zip for a URL is built in a local temporary file and uploaded as one object, a folder fsyncs every file and
  renames its manifest into place, an object-storage prefix writes its manifest last. fsspec's zip filesystem
  writes through to its target and has no such step, and its local filesystem does not fsync.
- each kind cleans up after a failed export its own way (an empty folder given as `--to` is emptied, not removed),
  and the errors differ (a damaged zip is a CorruptInputError naming the file).
- object storage uploads and fetches array chunks concurrently (`pipe`, `cat` of many keys): the local kinds
  write and read them one by one with no event loop between.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import shutil
import tempfile
import time
import zipfile
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import sqlalchemy as sa

from .. import remote
from ..errors import ConflictError, CorruptInputError, InvalidArgumentError, NotFoundError, StorageIOError
from .manifest import BLOCK, MANIFEST, MAX_LINE_CHARS, MAX_TEXT_BYTES, TABLES, _check_row, _read_manifest, _verify

# -------------------------------------------------------------------------------------------------- locations


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


# ------------------------------------------------------------------------------------------- writing a bundle


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


# ------------------------------------------------------------------------------------------- reading a bundle


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
            n = 0
            while line := lines.readline(MAX_LINE_CHARS + 1):  # a longer line is refused before it is read whole
                n += 1
                if len(line) > MAX_LINE_CHARS:
                    raise InvalidArgumentError(
                        f"bundle {self.location}: table {table}, row {n} is over {MAX_LINE_CHARS:,} characters "
                        f"(a value of a bundle may hold {MAX_TEXT_BYTES:,} bytes)"
                    )
                try:
                    row = json.loads(line)
                    if not isinstance(row, dict):
                        raise TypeError(f"a JSON {type(row).__name__}, not an object")
                    for col in dates:
                        if row.get(col) is not None:
                            row[col] = datetime.fromisoformat(row[col])
                except (ValueError, TypeError) as exc:
                    raise CorruptInputError(f"bundle {self.location}: {name} line {n} cannot be read ({exc})") from None
                _check_row(self, table, n, row, len(line))
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
