"""Conformance of every registered query and kind, found in the registry (built-in or plugin), with no hand list:
what the query engine promises each of them (queries/engine/request.py, queries/engine/).

Every query over one run's maps (`sources=`): kept (built, then read back) equals computed for the call on a
read-only store, for the whole run and for `examples=`; it answers from each source it declares; a source it does not
declare, a source that does not exist and an empty selection are refused in one line. Every kind with a range
reduction: the kept ranges' totals equal the per-example path's. A new query or kind joins the family by being
registered. One annotated run (tests/store/conftest.py: words, dependency trees, mentions, a FrameNet set, value
norms, a saliency), and for a query that needs a generated dataset (`register(dataset=...)`) a run over one
(tests/queries/helpers.py), on SQLite and PostgreSQL.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnstore.queries import QUERIES, load_all, run_query
from attnstore.queries import engine as summary_module
from attnstore.queries.engine import SOURCES
from attnstore.queries.errors import InvalidArgumentError
from attnstore.store.errors import NotFoundError
from attnstore.tests.queries.helpers import has_summaries, needle_run, read_only_store, repeated_run
from attnstore.tests.snapshots import store_with
from attnstore.tests.store.conftest import QUERY_PARAMS, annotated_run  # noqa: F401 (a fixture)

load_all(plugins=False)
ENGINE_QUERIES = sorted(name for name, spec in QUERIES.items() if spec.sources and spec.source == "attnstore")
RANGE_KINDS = sorted(name for name, kind in summary_module.KINDS.items() if kind.one_run and kind.totals is not None)
RTOL = 1e-12  # the kept ranges and the parts add the same per-range totals in the same order (queries/engine/)


def build_run(store, annotated_run):  # noqa: F811 (the fixture imported above)
    repeated_run(store, annotated_run.make_run)  # "repeated": a run over a generated repeated-token dataset
    needle_run(store, annotated_run.make_run)  # "needle": a needle-in-a-haystack run with its generation
    return annotated_run(store)


# The store with the annotated run, built once per session on SQLite and copied for each test (tests/snapshots.py).
store = store_with("run", build_run, helper="annotated_run")


@pytest.fixture
def run(store):
    return "shared"  # annotated_run's name


def run_for(name: str) -> str:
    """The fixture run query `name` answers on: the annotated run, or the run over the generated dataset it needs."""
    dataset = QUERIES[name].dataset
    return "shared" if dataset is None else {"repeated_tokens": "repeated", "needle": "needle"}[dataset[0]]


def same(a: pd.DataFrame, b: pd.DataFrame, name: str) -> None:
    assert list(a.columns) == list(b.columns) and len(a) == len(b), name
    for column in a.columns:
        x, y = a[column].to_numpy(), b[column].to_numpy()
        if x.dtype.kind in "fc" or y.dtype.kind in "fc":
            np.testing.assert_allclose(x.astype(float), y.astype(float), rtol=RTOL, atol=1e-15, equal_nan=True, err_msg=f"{name}.{column}")
        else:
            assert x.tolist() == y.tolist(), f"{name}.{column}"


def test_the_family_is_the_registry():
    assert len(ENGINE_QUERIES) >= 20 and {"entropy", "dependency", "norm_attention", "head_trees"} <= set(ENGINE_QUERIES)
    assert len(RANGE_KINDS) >= 8 and {"clark", "word_argmax", "head_trees"} <= set(RANGE_KINDS)


@pytest.mark.parametrize("name", ENGINE_QUERIES)
def test_kept_equals_computed_for_the_run_and_for_examples(store, run, name):
    run = run_for(name)  # the fixture `run` builds the store's runs
    params = QUERY_PARAMS.get(name, {})
    with read_only_store(store) as reader:  # nothing kept: computed for each call alone
        computed = run_query(reader, name, run=run, **params)
        computed_some = run_query(reader, name, run=run, examples=[2, 1], **params)  # 1: a mention's antecedent; 2: a frame
    built = run_query(store, name, run=run, **params)
    kept = run_query(store, name, run=run, **params)
    same(built, computed, name)
    same(kept, computed, name)
    same(run_query(store, name, run=run, examples=[1, 2], **params), computed_some, name)


# The sources and the ranges are the engine's, the same on either database: SQLite only. Every kind's own SQL
# (`prepare`, `labels`) and its kept summary meet PostgreSQL in test_kept_equals_computed_for_the_run_and_for_examples.
@pytest.mark.one_backend
@pytest.mark.parametrize("name", ENGINE_QUERIES)
def test_each_declared_source_answers_and_any_other_is_refused(store, run, name):
    run = run_for(name)  # the fixture `run` builds the store's runs
    spec = QUERIES[name]
    params = QUERY_PARAMS.get(name, {})
    for source in spec.sources:
        assert not run_query(store, name, run=run, weights=source, **params).empty, (name, source)
    for source in sorted(set(SOURCES) - set(spec.sources)):
        with pytest.raises(InvalidArgumentError, match=rf"^query '{name}' answers from 'attention', 'maps' only, not weights='{source}'"):
            run_query(store, name, run=run, weights=source, **params)
    with pytest.raises(InvalidArgumentError, match=r"^weights='bogus' is no map source; the sources are 'attention': "):
        run_query(store, name, run=run, weights="bogus", **params)
    with pytest.raises(InvalidArgumentError, match=r"^examples= selects no example"):
        run_query(store, name, run=run, examples=[], **params)
    # an example the run does not store: named (frame_heads leaves it out, as it samples from a whole corpus, and then
    # finds no FrameNet sentence among those left)
    with pytest.raises((NotFoundError, InvalidArgumentError), match=r"no stored example\(s\) \[9\]|no FrameNet sentence"):
        run_query(store, name, run=run, examples=[9], **params)


@pytest.mark.one_backend
@pytest.mark.parametrize("kind_name", RANGE_KINDS)
def test_kept_ranges_equal_the_per_example_path(store, run, kind_name):
    kind = summary_module.KINDS[kind_name]
    info = store.run_info(run)
    kept = summary_module.summary_totals(store, info, kind)  # built and kept, with its ranges
    assert has_summaries(store, run) and summary_module.kept_ranges(store, info, kind) is not None
    parts = summary_module.summary_totals(store, info, kind, use_ranges=False)
    assert kept.keys() == parts.keys(), kind_name
    for field, value in kept.items():
        if np.asarray(value).dtype.kind in "US":
            assert np.asarray(value).tolist() == np.asarray(parts[field]).tolist(), (kind_name, field)
        else:
            np.testing.assert_allclose(value, parts[field], rtol=RTOL, atol=0, err_msg=f"{kind_name}.{field}")
