"""A SELECT's rows as a pandas DataFrame, equal to `pd.read_sql_query`'s, without a SQLAlchemy Row per row.

`pd.read_sql_query(query, conn)` fetches through SQLAlchemy, which builds a Row object per row and runs each column's
result processor per value: for the token table of MRPC dev (21,723 rows, 4 columns) ~85 ms on top of ~45 ms of
SQL, and the objects it made set off the garbage collector's full collections (median 154 ms with the collector on;
2026-11-28, 466762e). Here the compiled statement runs on the driver's own cursor, whose rows are plain tuples,
and the frame is built from them as pandas builds it (`DataFrame.from_records`, floats coerced). Only where every
column needs no per-value processing: a column whose SQLAlchemy type has no result processor on this dialect, or a
Boolean stored as 0/1 (SQLite), turned into Python's bools here the way SQLAlchemy would. Anything else (dates on
SQLite, JSON, an IN list bound at execution) goes through `pd.read_sql_query` as before.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import sqlalchemy as sa

# Column types whose values the drivers give as pandas would get them from SQLAlchemy (Boolean: see `_as_booleans`).
PLAIN_TYPES = (sa.Integer, sa.String, sa.Boolean, sa.Float, sa.types.NullType)


def sql_frame(conn: sa.Connection, query: Any) -> pd.DataFrame:
    """`pd.read_sql_query(query, conn)`, from the driver's tuples where the columns allow it (see the module)."""
    fast = _driver_statement(conn, query)
    if fast is None:
        return pd.read_sql_query(query, conn)
    sql, params, booleans = fast
    cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
    try:
        cursor.execute(sql, params)
        columns = [d[0] for d in cursor.description]
        rows = cursor.fetchall()
    finally:
        cursor.close()
    frame = pd.DataFrame.from_records(rows, columns=columns, coerce_float=True)
    for at in booleans:  # by position: an unlabelled expression has no name of its own, two columns may share one
        frame.isetitem(at, _as_booleans(frame.iloc[:, at]))
    return frame


def _driver_statement(conn: sa.Connection, query: Any) -> tuple[str, Any, list[int]] | None:
    """(SQL text, its parameters in the driver's style, the positions of the Boolean columns to turn into bools), or
    None where the rows need SQLAlchemy's processing."""
    if not isinstance(query, sa.Select):
        return None
    dialect = conn.dialect
    booleans = []
    for at, column in enumerate(query.selected_columns):
        kind = column.type
        if not isinstance(kind, PLAIN_TYPES) or isinstance(kind, sa.Numeric) and not isinstance(kind, sa.Float):
            return None  # dates (pandas gives their time zones its own way), JSON, decimals, enums, bytes ...
        try:
            processes = kind.dialect_impl(dialect).result_processor(dialect, None) is not None
        except Exception:  # a processor chosen by the driver's type code (floats on psycopg): leave it to SQLAlchemy
            return None
        if isinstance(kind, sa.Boolean) and processes:
            booleans.append(at)
        elif processes:
            return None
    compiled = query.compile(dialect=dialect)
    sql = str(compiled)
    if "POSTCOMPILE" in sql or compiled.literal_execute_params or compiled.post_compile_params:
        return None
    values = compiled.construct_params()
    if compiled.positional:
        params: Any = tuple(values[name] for name in compiled.positiontup or ())
    else:
        params = values
    return sql, params, booleans


def _as_booleans(values: pd.Series) -> pd.Series:
    """A 0/1 column as SQLAlchemy's Boolean gives it: bool dtype, or objects (True, False, None) where a value is NULL."""
    if values.dtype != object and not values.isna().any():
        return values.astype(bool)
    as_object = np.array([None if v is None or v != v else bool(v) for v in values.tolist()], dtype=object)
    return pd.Series(as_object, index=values.index, name=values.name)
