"""store/frames.py: a SELECT's frame from the driver's tuples equals pd.read_sql_query's, on SQLite and PostgreSQL,
column types and NULLs included; what needs SQLAlchemy's per-value processing goes through pd.read_sql_query."""

from __future__ import annotations

import datetime

import numpy as np
import pandas as pd
import pytest
import sqlalchemy as sa

from attnstore.store import frames
from attnstore.store.db import create_engine

META = sa.MetaData()
THINGS = sa.Table(
    "frame_things",
    META,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("big", sa.BigInteger),
    sa.Column("small", sa.SmallInteger, nullable=False),
    sa.Column("name", sa.String(40)),
    sa.Column("note", sa.Text, nullable=False),
    sa.Column("flag", sa.Boolean, nullable=False),
    sa.Column("maybe", sa.Boolean),
    sa.Column("score", sa.Float),
    sa.Column("at", sa.DateTime),
    sa.Column("extra", sa.JSON),
)
ROWS = [
    dict(id=1, big=2**40, small=3, name="a", note="x", flag=True, maybe=None, score=0.5, at=datetime.datetime(2026, 1, 2), extra={"k": 1}),
    dict(id=2, big=None, small=-1, name=None, note="", flag=False, maybe=True, score=None, at=None, extra=None),
    dict(id=3, big=7, small=0, name="Ġc", note="z", flag=True, maybe=False, score=-2.25, at=None, extra=[1]),
]


@pytest.fixture
def engine(db_url):
    engine = create_engine(db_url)
    META.create_all(engine)
    with engine.begin() as conn:
        conn.execute(THINGS.insert(), ROWS)
    yield engine
    engine.dispose()


def both(engine, query) -> tuple[pd.DataFrame, pd.DataFrame]:
    with engine.connect() as conn:
        return frames.sql_frame(conn, query), pd.read_sql_query(query, conn)


PLAIN = ("id", "big", "small", "name", "note", "flag", "maybe", "score")


@pytest.mark.parametrize(
    "columns",
    [PLAIN, ("flag",), ("maybe",), ("big", "maybe"), ("name", "note"), ("score",)],
)
def test_frames_from_the_drivers_tuples_equal_read_sql_query(engine, columns, monkeypatch):
    """Integer (NULLs: float with NaN), text (NULLs: None), Boolean without NULLs (bool) and with them (objects),
    Float: equal frames, dtypes included, and read from the driver's cursor (read_sql_query not called)."""
    query = sa.select(*(THINGS.c[name] for name in columns)).order_by(THINGS.c.id)
    if "score" in columns and engine.dialect.name == "postgresql":
        pytest.skip("psycopg's float processor is chosen by its type code: read through SQLAlchemy (tested below)")
    with engine.connect() as conn:
        expected = pd.read_sql_query(query, conn)
        monkeypatch.setattr(frames.pd, "read_sql_query", lambda *a, **k: pytest.fail("read through SQLAlchemy's rows"))
        got = frames.sql_frame(conn, query)
    pd.testing.assert_frame_equal(got, expected)


def test_labels_bound_parameters_and_no_rows(engine):
    query = sa.select(THINGS.c.id.label("example"), (THINGS.c.small + 1).label("next"), THINGS.c.flag).where(
        THINGS.c.id >= sa.bindparam("low", 2), THINGS.c.note != "zz"
    )
    got, expected = both(engine, query.order_by(THINGS.c.id))
    pd.testing.assert_frame_equal(got, expected)
    assert got["example"].tolist() == [2, 3] and got["flag"].dtype == np.bool_
    unnamed = sa.select(THINGS.c.id, THINGS.c.flag, (THINGS.c.small > 0), THINGS.c.maybe.label("flag")).order_by(THINGS.c.id)
    got, expected = both(engine, unnamed)  # an unlabelled Boolean expression, two columns named "flag"
    pd.testing.assert_frame_equal(got, expected)
    got, expected = both(engine, query.where(sa.false()))
    pd.testing.assert_frame_equal(got, expected)
    assert len(got) == 0 and list(got.columns) == ["example", "next", "flag"]


@pytest.mark.parametrize("what", ["dates", "json", "in-list", "text", "floats"])
def test_what_needs_sqlalchemys_processing_goes_through_read_sql_query(engine, what, monkeypatch):
    queries = {
        "dates": sa.select(THINGS.c.id, THINGS.c.at),
        "json": sa.select(THINGS.c.id, THINGS.c.extra),
        "in-list": sa.select(THINGS.c.id, THINGS.c.name).where(THINGS.c.id.in_([1, 3])),
        "text": sa.text("SELECT id, name FROM frame_things"),
        "floats": sa.select(THINGS.c.id, THINGS.c.score),
    }
    query = queries[what]
    if what == "floats" and engine.dialect.name == "sqlite":
        pytest.skip("SQLite's floats need no processor: read from the driver's tuples (tested above)")
    seen = []
    real = pd.read_sql_query
    monkeypatch.setattr(frames.pd, "read_sql_query", lambda *a, **k: seen.append(1) or real(*a, **k))
    with engine.connect() as conn:
        got = frames.sql_frame(conn, query)
    assert seen == [1]
    with engine.connect() as conn:
        pd.testing.assert_frame_equal(got, real(query, conn))


def test_the_stores_token_and_example_tables_are_unchanged(store, make_run, monkeypatch):
    """The store's own frames (`_frame`): equal to what pd.read_sql_query gave before."""
    rng = np.random.default_rng(0)
    maps = [rng.dirichlet(np.ones(n), size=(2, 2, n)).astype(np.float32) for n in (4, 6)]
    run = make_run(store, maps, [["[CLS]", "a", ",", "[SEP]"], ["[CLS]", "b", "c", ".", "d", "[SEP]"]])
    fast = {
        "tokens": store.token_table(run),
        "roles": store.token_roles(run),
        "examples": store.examples(run),
        "runs": store.runs(),
    }
    monkeypatch.setattr(frames, "_driver_statement", lambda conn, query: None)
    slow = {"tokens": store.token_table(run), "roles": store.token_roles(run), "examples": store.examples(run), "runs": store.runs()}
    for name in fast:
        pd.testing.assert_frame_equal(fast[name], slow[name], obj=name)
    assert fast["roles"]["is_special"].tolist() == [True, False, False, True, True, False, False, False, False, True]
