"""Values from pandas, numpy and SQL as JSON: the bodies of the API's answers."""

import json
import math
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


def dumps(payload: Any) -> str:
    return json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
