"""Array roots on object storage (`--root s3://bucket/prefix`): opening, checking, and one-line errors.

A root with a URL scheme other than file:// is opened through fsspec (`store.arrays.open_root`).
For s3:// this module adds bounded timeouts and retries and turns off listing caches, so a
reader never sees a stale list of chunks, and it checks a root once before it is used:

- `check_root(root)`: the bucket exists and answers (one LIST of at most one key);
- `check_writable(root)`: a test object can be written and deleted, so a writing command with
  read-only credentials fails before doing anything, with `ReadOnlyStoreError`.

`translate` turns what s3fs / botocore raise (no credentials, access denied, no such bucket,
an endpoint that does not answer) into one-line attnstore errors naming the root and the fix.
The `s3` extra (fsspec + s3fs) is imported only here and only for such roots: a missing one is
a `ModuleNotFoundError` naming s3fs, which the CLI prints as the `pip install` line.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

from zarr.storage import FsspecStore

from .errors import AttnStoreError, NotFoundError, ReadOnlyStoreError, StorageIOError

# Bounded waits: an endpoint that does not answer fails in about CONNECT_TIMEOUT_S * MAX_ATTEMPTS
# seconds, not botocore's default of 60 s per attempt. Overridable with fsspec's own configuration
# (FSSPEC_S3='{"config_kwargs": {"connect_timeout": 30}}' or ~/.config/fsspec/s3.json).
CONNECT_TIMEOUT_S = 5
READ_TIMEOUT_S = 60
MAX_ATTEMPTS = 3
PROBE_PREFIX = ".attnstore-write-test-"
CREDENTIALS_FIX = "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) to credentials for this bucket"


def is_remote(root: str) -> bool:
    """Whether the array root is an fsspec URL (s3://, gs://, ...) rather than a local path or file:// URL."""
    return "://" in root and not root.startswith("file://")


def protocol(root: str) -> str:
    return root.split("://", 1)[0].lower()


def is_s3(root: str) -> bool:
    return is_remote(root) and protocol(root) in ("s3", "s3a")


def bucket_and_prefix(root: str) -> tuple[str, str]:
    rest = root.split("://", 1)[1]
    bucket, _, prefix = rest.partition("/")
    return bucket, prefix.strip("/")


def endpoint(root: str) -> str:
    """Where s3:// requests go, for messages: FSSPEC_S3_ENDPOINT_URL, fsspec's configuration, AWS_ENDPOINT_URL(_S3), else AWS."""
    url = os.environ.get("FSSPEC_S3_ENDPOINT_URL")
    if not url and "fsspec.config" in sys.modules:
        conf = sys.modules["fsspec.config"].conf.get("s3", {})
        url = conf.get("endpoint_url") or (conf.get("client_kwargs") or {}).get("endpoint_url")
    return url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "AWS S3"


def storage_options(root: str) -> dict[str, Any]:
    """fsspec options for opening `root`: for s3://, timeouts, retries and no listing cache."""
    if not is_s3(root):
        return {}
    import fsspec.config

    configured = fsspec.config.conf.get("s3", {}).get("config_kwargs")  # e.g. FSSPEC_S3='{"config_kwargs": {...}}'
    configured = configured if isinstance(configured, dict) else {}
    config = {
        "connect_timeout": CONNECT_TIMEOUT_S,
        "read_timeout": READ_TIMEOUT_S,
        "retries": {"max_attempts": MAX_ATTEMPTS, "mode": "standard"},
        **configured,
    }
    # max_concurrency 1: s3fs (2025.x) otherwise sends a HEAD before every whole-object GET, to split objects over
    # 50 MB into parallel ranges; attnstore's objects are chunks of at most a few MB, so that HEAD doubled the
    # requests of every read (a query on a small run: 477 requests, 264 of them HEADs)
    options: dict[str, Any] = {"use_listings_cache": False, "config_kwargs": config, "max_concurrency": 1}
    if os.environ.get("FSSPEC_S3_ENDPOINT_URL"):  # read now: fsspec reads it only when first imported
        options["endpoint_url"] = os.environ["FSSPEC_S3_ENDPOINT_URL"]
    return options


class RemoteStore(FsspecStore):
    """An FsspecStore whose storage failures (network, credentials, permissions) are one-line attnstore
    errors naming the root and the fix: `StorageIOError`, `ReadOnlyStoreError` (writes refused) or
    `NotFoundError` (no such bucket). All are OSErrors too, so writers treat them as I/O failures."""

    def _failed(self, exc: Exception, doing: str) -> Exception:
        return translate(exc, f"{protocol_of(self.fs)}://{self.path}", doing) or exc

    async def get(self, *args, **kwargs):
        try:
            return await super().get(*args, **kwargs)
        except Exception as exc:
            raise self._failed(exc, "read") from None

    async def get_partial_values(self, *args, **kwargs):
        try:
            return await super().get_partial_values(*args, **kwargs)
        except Exception as exc:
            raise self._failed(exc, "read") from None

    async def exists(self, key: str) -> bool:
        try:
            return await super().exists(key)
        except Exception as exc:
            raise self._failed(exc, "read") from None

    async def getsize(self, key: str) -> int:
        try:
            return await super().getsize(key)
        except Exception as exc:
            raise self._failed(exc, "read") from None

    async def set(self, *args, **kwargs) -> None:
        try:
            await super().set(*args, **kwargs)
        except Exception as exc:
            raise self._failed(exc, "write") from None

    async def delete(self, key: str) -> None:
        try:
            await super().delete(key)
        except Exception as exc:
            raise self._failed(exc, "write") from None

    async def delete_dir(self, prefix: str) -> None:
        try:
            await super().delete_dir(prefix)
        except Exception as exc:
            raise self._failed(exc, "write") from None

    async def list(self) -> AsyncIterator[str]:
        try:
            async for key in super().list():
                yield key
        except Exception as exc:
            raise self._failed(exc, "list") from None

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        try:
            async for key in super().list_dir(prefix):
                yield key
        except Exception as exc:
            raise self._failed(exc, "list") from None

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        try:
            async for key in super().list_prefix(prefix):
                yield key
        except Exception as exc:
            raise self._failed(exc, "list") from None


def protocol_of(fs) -> str:
    proto = fs.protocol
    return proto[0] if isinstance(proto, (tuple, list)) else str(proto)


def fsspec_store(root: str, read_only: bool) -> FsspecStore:
    """A Zarr store for a remote root; the s3 extra is imported first so its absence is one clear line."""
    if is_s3(root):
        import fsspec  # noqa: F401  ModuleNotFoundError(name="fsspec") -> "needs the 's3' extra"
        import s3fs  # noqa: F401  ModuleNotFoundError(name="s3fs")
    try:
        return RemoteStore.from_url(root, read_only=read_only, storage_options=storage_options(root))
    except ModuleNotFoundError:
        raise
    except ImportError as exc:  # fsspec's "Install gcsfs to access Google Storage": not a ModuleNotFoundError
        raise StorageIOError(f"cannot open array root {root}: {exc}") from None
    except ValueError as exc:  # e.g. an unknown protocol
        raise StorageIOError(f"cannot open array root {root}: {exc}") from None


def failed(array, exc: BaseException) -> bool:
    """Whether reading `array` failed because its object store did (not because the data is damaged)."""
    return isinstance(array.store_path.store, RemoteStore) and (isinstance(exc, AttnStoreError) or is_storage_failure(exc))


def _transport_errors() -> tuple[type[BaseException], ...]:
    """Exception classes meaning "the storage failed", not "the data is damaged" (only modules already loaded)."""
    classes: list[type[BaseException]] = [OSError, asyncio.TimeoutError]
    if "botocore.exceptions" in sys.modules:
        exc = sys.modules["botocore.exceptions"]
        classes += [exc.BotoCoreError, exc.ClientError]
    if "aiohttp" in sys.modules:
        classes.append(sys.modules["aiohttp"].ClientError)
    return tuple(classes)


def is_storage_failure(exc: BaseException) -> bool:
    """True for I/O, network, credential and permission errors of the array root (never for damaged bytes)."""
    return isinstance(exc, _transport_errors()) and not isinstance(exc, AttnStoreError)


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:200]


def _code(exc: BaseException) -> str:
    """The S3 error code behind an exception (s3fs keeps botocore's ClientError as the cause)."""
    for e in (exc, exc.__cause__):
        response = getattr(e, "response", None)
        if isinstance(response, dict):
            return str((response.get("Error") or {}).get("Code") or "")
    return ""


class WriteRefused(ReadOnlyStoreError):
    """The object store refused a write with these credentials (they may read, not write)."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


REFUSED_CREDENTIALS = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken", "InvalidClientTokenId")
UNREACHABLE = ("EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError", "ProxyConnectionError")


def translate(exc: BaseException, root: str, doing: str = "read") -> AttnStoreError | None:
    """The one-line attnstore error for a storage failure of a remote `root` (None: not a storage failure)."""
    if isinstance(exc, AttnStoreError) or not is_storage_failure(exc):
        return None
    where = f"array root {root}"
    name, code, reason = type(exc).__name__, _code(exc), _reason(exc)
    bucket, _ = bucket_and_prefix(root)
    if name in ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"):
        return StorageIOError(f"cannot {doing} {where}: no usable S3 credentials ({reason}); {CREDENTIALS_FIX}")
    if code in REFUSED_CREDENTIALS:
        return StorageIOError(f"cannot {doing} {where}: the S3 credentials were refused ({code}: {reason}); {CREDENTIALS_FIX}")
    if isinstance(exc, PermissionError) or code == "AccessDenied":
        if doing == "write":
            return WriteRefused(
                f"{where} is read-only for these credentials (writing was refused: {reason}); it can be read: "
                "open it with --read-only (ATTNSTORE_READ_ONLY=1), or use credentials that may write",
                reason,
            )
        return StorageIOError(
            f"cannot {doing} {where}: access denied ({reason}); reading needs s3:ListBucket and s3:GetObject: {CREDENTIALS_FIX}"
        )
    if code == "NoSuchBucket" or (isinstance(exc, FileNotFoundError) and "bucket" in reason.lower()):
        return NotFoundError(
            f"bucket {bucket!r} of {where} does not exist at {endpoint(root)}; create it (aws s3 mb s3://{bucket}) or fix --root"
        )
    if name in UNREACHABLE or isinstance(exc, (asyncio.TimeoutError, ConnectionError)) or type(exc).__module__.startswith("aiohttp"):
        return StorageIOError(
            f"cannot reach the object store at {endpoint(root)} for {where} ({reason}); check the endpoint "
            "(FSSPEC_S3_ENDPOINT_URL or AWS_ENDPOINT_URL for S3-compatible servers), the network, and that the server is up"
        )
    return StorageIOError(f"cannot {doing} {where}: {name}: {reason}")


@contextmanager
def storage_errors(root: str, doing: str = "read") -> Iterator[None]:
    """Turn storage failures of a remote root into one-line attnstore errors (local roots: unchanged)."""
    try:
        yield
    except Exception as exc:
        error = translate(exc, root, doing) if is_remote(root) else None
        if error is None:
            raise
        raise error from None


def check_root(root: str) -> None:
    """One request: the root's bucket exists, answers, and these credentials may list it."""
    if not is_s3(root):
        return
    from zarr.core.sync import sync

    store = fsspec_store(root, read_only=True)
    bucket, prefix = bucket_and_prefix(root)
    with storage_errors(root, "read"):
        sync(store.fs._call_s3("list_objects_v2", Bucket=bucket, Prefix=prefix + "/" if prefix else "", MaxKeys=1))


def check_writable(root: str) -> None:
    """Write and delete a test object under the root: ReadOnlyStoreError for read-only credentials."""
    if not is_s3(root):
        return
    from zarr.core.sync import sync

    check_root(root)
    store = fsspec_store(root, read_only=False)
    bucket, prefix = bucket_and_prefix(root)
    key = f"{prefix}/{PROBE_PREFIX}{uuid.uuid4().hex}" if prefix else f"{PROBE_PREFIX}{uuid.uuid4().hex}"
    fs = store.fs
    with storage_errors(root, "write"):
        sync(fs._call_s3("put_object", Bucket=bucket, Key=key, Body=b""))
        sync(fs._call_s3("delete_object", Bucket=bucket, Key=key))
