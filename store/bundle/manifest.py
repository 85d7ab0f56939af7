"""The bundle format: its name and version, the tables a bundle carries, and its manifest.

`manifest.json` is what makes a bundle whole: it names the format and version, the attnstore version and
schema revision that wrote it, the runs, models and tables, and the sha256 + size of every other file.
`_read_manifest` refuses another format, another format version or a newer schema revision before anything
else is read; `_verify` checks every listed file against its checksum (container.py's `open_bundle` calls
both). The transfer sizes every part uses are here too, beside the tables.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
import zlib
from typing import TYPE_CHECKING

import sqlalchemy as sa

from ..errors import CorruptInputError, InvalidArgumentError, SchemaOutOfDateError
from ..schema import Base

if TYPE_CHECKING:
    from .container import Bundle

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
    "head_matches",
    "probe_results",
    "pattern_labels",
    "ablation_results",
)
TABLES: dict[str, sa.Table] = {name: Base.metadata.tables[name] for name in TABLE_ORDER}
BATCH_ROWS = 5000  # rows per INSERT batch and per read of the source
# The most one text (or JSON) value of an imported row may hold, in UTF-8 bytes: an example's text, a word, a token, a
# run's manifest. Ingest makes none near it (an example is a sentence or a window of a document); a bundle holding more
# is refused, so that no reader of the store (the HTTP server's examples, its SQL answers: 1,000,000 bytes a value)
# meets a value planted by a bundle.
MAX_TEXT_BYTES = 1_000_000
# The longest line of a table file read: a row of several values at their limit, each escaped by JSON (\uXXXX).
MAX_LINE_CHARS = 16 * MAX_TEXT_BYTES
BATCH_KEYS = 32  # Zarr keys fetched or stored concurrently (chunks are 2 MiB by default)
BLOCK = 1 << 20


def _safe_name(name: str, what: str) -> str:
    """A relative POSIX path inside a bundle: no absolute path, no `..`, no empty or odd component."""
    parts = name.split("/")
    if not name or name.startswith("/") or "\\" in name or any(p in ("", ".", "..") for p in parts):
        raise CorruptInputError(f"{what}: {name!r} is not a safe relative path; the bundle is damaged or was not made by attnstore")
    return name


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
    from ..migrate import head_revision, known_revisions

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


def _attnstore_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("attnstore")
    except PackageNotFoundError:
        return "unknown"


def _schema_revision(engine: sa.Engine) -> str | None:
    from ..migrate import current_revision

    return current_revision(engine)


def _row_limits(table: str) -> tuple[frozenset[str], dict[str, int], frozenset[str]]:
    """(the table's columns, {String(n) column: n}, the columns whose values are bounded by MAX_TEXT_BYTES)."""
    columns = TABLES[table].columns
    lengths = {c.name: c.type.length for c in columns if isinstance(c.type, sa.String) and c.type.length}
    texts = frozenset(c.name for c in columns if isinstance(c.type, (sa.String, sa.JSON)) and c.name not in lengths)
    return frozenset(c.name for c in columns), lengths, texts


_LIMITS = {table: _row_limits(table) for table in TABLE_ORDER}


def _check_row(bundle: Bundle, table: str, line: int, row: dict, line_chars: int) -> None:
    """Refuse (one line naming the bundle, the table, the row and the limit) a row with a column the table does not
    have -- it would be dropped without a word -- or a value over its column's length or MAX_TEXT_BYTES."""
    known, lengths, texts = _LIMITS[table]

    def where() -> str:
        key = ", ".join(f"{c.name} {row[c.name]}" for c in TABLES[table].primary_key.columns if c.name in row)
        return f"bundle {bundle.location}: table {table}, row {line}" + (f" ({key})" if key else "")

    if not known.issuperset(row):
        unknown = sorted(set(row) - known)
        raise InvalidArgumentError(
            f"{where()} has column {', '.join(repr(c) for c in unknown)}, which table {table} of this attnstore does not "
            f"have (the bundle says schema {bundle.manifest.get('schema_revision')!r}, attnstore "
            f"{bundle.manifest.get('attnstore_version', '?')}); refused rather than imported without it"
        )
    for column, limit in lengths.items():
        value = row.get(column)
        if isinstance(value, str) and len(value) > limit:
            raise InvalidArgumentError(f"{where()}: {column} holds {len(value):,} characters, over the {limit} of its column")
    if line_chars <= MAX_TEXT_BYTES // 4:  # no value of a shorter line can pass the limit, whatever it holds
        return
    for column in texts:
        value = row.get(column)
        if value is None:
            continue
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        size = len(text.encode("utf-8", "surrogatepass"))  # at most 4 bytes a character of the line
        if size > MAX_TEXT_BYTES:
            raise InvalidArgumentError(
                f"{where()}: {column} holds {size:,} bytes, over the {MAX_TEXT_BYTES:,} a text value of a bundle may hold"
            )
