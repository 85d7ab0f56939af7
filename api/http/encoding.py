"""Values from pandas, numpy and SQL as JSON: the bodies of the API's answers."""

import io
import json
import math
import threading
from datetime import date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd


def json_value(value: Any) -> Any:
    """A value from pandas / numpy / SQL as JSON: numbers as numbers, NaN and missing as null, times as ISO text."""
    import pandas as pd

    if isinstance(value, np.generic):
        value = value.item()
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Decimal):
        return json_value(float(value))
    if isinstance(value, datetime | date | pd.Timestamp):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_value(v) for v in value]
    if isinstance(value, bytes | memoryview):
        return bytes(value).hex()
    return str(value)


def _rows(frame: "pd.DataFrame") -> list[list]:
    """A frame's rows as JSON values, converted a column at a time (row iteration over nullable dtypes is slow)."""
    columns = [[json_value(v) for v in frame.iloc[:, i].tolist()] for i in range(frame.shape[1])]
    return [list(row) for row in zip(*columns)] if columns else [[] for _ in range(len(frame))]


def records(frame: "pd.DataFrame") -> list[dict]:
    columns = [str(c) for c in frame.columns]
    return [dict(zip(columns, row)) for row in _rows(frame)]


def table(frame: "pd.DataFrame") -> dict:
    return {"columns": [str(c) for c in frame.columns], "rows": _rows(frame)}


def npy_bytes(values: np.ndarray) -> bytes:
    """The bytes `np.save` writes for the array (format 1.0: its header, then the data in C order), with one copy of
    the data: `np.save` into a BytesIO copies it three times (to bytes in chunks, into the buffer, out of it)."""
    values = values if values.flags.c_contiguous else values.copy(order="C")
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(head, np.lib.format.header_data_from_array_1_0(values))
    return b"".join((head.getvalue(), values.reshape(-1).view(np.uint8).data))


def dumps(payload: Any) -> str:
    return json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


# ------------------------------------------------------------------ float16 maps as JSON text

# For each rounding (`digits`, None: none), the JSON text of every float16 value, as `json.dumps(round(float(v), d))`
# writes it (NaN and infinities: None); made on first use (65,536 values, ~50 ms), kept for the process.
_FLOAT16_TEXT: dict[int | None, np.ndarray] = {}
_FLOAT16_LOCK = threading.Lock()


def _float16_text(digits: int | None) -> np.ndarray:
    table = _FLOAT16_TEXT.get(digits)
    if table is None:
        values = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float64)
        finite = np.isfinite(values)
        if digits is not None:
            values = np.where(finite, np.round(np.where(finite, values, 0.0), digits), values)
        table = np.array([repr(v) if ok else None for v, ok in zip(values.tolist(), finite.tolist())], dtype=object)
        with _FLOAT16_LOCK:
            table = _FLOAT16_TEXT.setdefault(digits, table)
    return table


def float16_json(values: np.ndarray, digits: int | None = None) -> str | None:
    """A float16 array as the JSON text of its nested lists, the bytes `dumps(np.round(values.astype(float64), digits)
    .tolist())` gives, from a table of every float16's text instead of a float conversion per value (a layer of
    maps: ~1 ms instead of ~10); None where that does not apply (another dtype, a non-finite value, no axes)."""
    if values.dtype != np.float16 or values.ndim == 0 or values.size == 0:
        return None
    texts = _float16_text(digits)[np.ascontiguousarray(values).view(np.uint16)]
    rows = texts.reshape(-1, values.shape[-1]).tolist()
    try:
        parts = ["[" + ",".join(row) + "]" for row in rows]
    except TypeError:  # a None: NaN or infinity, which JSON has no number for
        return None
    for size in reversed(values.shape[:-1]):
        parts = ["[" + ",".join(parts[i : i + size]) + "]" for i in range(0, len(parts), size)]
    return parts[0] if len(parts) == 1 else "[" + ",".join(parts) + "]"


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an Accept-Encoding header admits gzip (RFC 9110 12.5.3: `gzip` or `*`, with a q-value above 0 unless
    given as 0; browsers, requests and httpx all send `gzip`)."""
    for part in accept_encoding.split(","):
        name, _, params = part.strip().partition(";")
        if name.strip().lower() not in ("gzip", "*"):
            continue
        q = params.strip().lower()
        if q.startswith("q="):
            try:
                if float(q[2:]) <= 0:
                    continue
            except ValueError:
                continue
        return True
    return False
