"""Range reductions of the Kovaleva, Kobayashi, Jain & Wallace, head-distance, dependency and tree kinds
(queries/engine/totals.py `summary_totals`): a whole-run `feature_attention`, `cls_feature_attention`, `token_to_token`,
`norm_attention`, `head_distances`, `head_clusters`, `attention_attribution`, `dependency`, `dependency_summary`,
`head_trees` or `head_trees_summary` adds its kind's totals kept per range of examples instead of every example's
fields. The range path against the per-example path (relative 1e-12, the Clark kind's tolerance in
tests/queries/test_range_totals.py), and no per-example field read once the ranges are kept. The exact values of each
query on hand-built maps (tests/queries/test_kovaleva_*.py, test_value_norms.py, test_attribution.py,
test_head_clusters.py, test_dependency.py, test_trees.py) go through the range path too: a whole-run query reads its
ranges."""

from __future__ import annotations

import numpy as np
import pytest

from attnstore.queries import engine as summary
from attnstore.queries import load_all, run_query
from attnstore.queries.attribution import ATTRIBUTION_TAU
from attnstore.queries.dependency import WORD_ARGMAX
from attnstore.queries.engine import kept_ranges
from attnstore.queries.feature_attention import KOVALEVA_FEATURES
from attnstore.queries.head_clusters import HEAD_JS
from attnstore.queries.norm_attention import NORM_CLASSES
from attnstore.queries.token_to_token import KOVALEVA_RELATIONS
from attnstore.queries.trees import HEAD_TREES
from attnstore.tests.queries import reference
from attnstore.tests.queries.helpers import random_maps, write_saliency
from attnstore.tests.queries.test_kovaleva_token_to_token import TOKENS_A, TOKENS_B, TOKENS_C, TW_A, TW_B, TW_C, WORDS_A, WORDS_B, WORDS_C

# The analysis, not the database: SQLite only (kept summaries are Zarr; each query's SQL meets PostgreSQL in test_conformance.py).
pytestmark = pytest.mark.one_backend

RTOL = 1e-12
REFERENCE_RTOL = 1e-9  # the naive references add in other orders
NORM_RTOL = 2e-6  # and weight the maps in float64 where the queries weigh them in float32 (as test_kovaleva_token_to_token)
N_EXAMPLES = 7  # in ranges of 2: 4 ranges, the last of one example
SHAPES = [(TOKENS_A, WORDS_A, TW_A), (TOKENS_B, WORDS_B, TW_B), (TOKENS_C, WORDS_C, TW_C)]

CASES = [
    ("feature_attention", {}),
    ("feature_attention", {"weights": "norm"}),
    ("cls_feature_attention", {"pool": "max"}),
    ("cls_feature_attention", {"pool": "sum", "layer": 0}),
    ("token_to_token", {"statistic": "token_max"}),
    ("token_to_token", {"statistic": "word_mean", "relations": "pronoun_to_noun,subject_to_verb"}),
    ("token_to_token", {"weights": "norm"}),
    ("norm_attention", {}),
    ("head_distances", {}),
    ("head_distances", {"smoothing": 0.0, "weights": "norm"}),
    ("head_clusters", {}),
    ("attention_attribution", {}),
    ("attention_attribution", {"specials": "include", "saliency": "absolute"}),
    ("dependency", {"min_count": 1}),
    ("dependency", {"min_count": 1, "head2dep": "direct", "poss_apostrophe": False}),
    ("dependency", {"min_count": 1, "weights": "norm"}),
    ("dependency_summary", {"min_count": 1, "direction": "each", "root_in_all": False}),
    ("head_trees", {"min_count": 1}),
    ("head_trees", {"min_count": 1, "specials": "include", "weights": "norm"}),
    ("head_trees_summary", {"min_count": 1}),
]
KINDS = [
    *[(kind, {}) for kind in (KOVALEVA_FEATURES, KOVALEVA_RELATIONS, NORM_CLASSES, HEAD_JS, ATTRIBUTION_TAU, WORD_ARGMAX, HEAD_TREES)],
    (HEAD_TREES, {"specials": "include", "weights": "norm"}),
]


@pytest.fixture
def ranged_run(store, make_run):
    """Seven examples cycling through the three designed sentences, random float16 maps (3 layers x 2 heads), value
    norms and a saliency."""
    rng = np.random.default_rng(11)
    chosen = [SHAPES[i % 3] for i in range(N_EXAMPLES)]
    norms = [(rng.random((3, 2, len(t))) * 3 + 0.1).astype(np.float16).astype(np.float32) for t, _, _ in chosen]
    run = make_run(
        store,
        [random_maps(len(t), i, 3, 2) for i, (t, _, _) in enumerate(chosen)],
        [t for t, _, _ in chosen],
        name="ranged-kinds",
        dtype="float16",
        words_list=[w for _, w, _ in chosen],
        token_words=[tw for _, _, tw in chosen],
        norms_list=norms,
    )
    write_saliency(store, run, [rng.normal(size=len(t)) for t, _, _ in chosen])
    return run


def frames_close(a, b, name, rtol=RTOL):
    assert list(a.columns) == list(b.columns) and len(a) == len(b), name
    for column in a.columns:
        if a[column].dtype.kind in "fiu":
            got, want = a[column].to_numpy(float), b[column].to_numpy(float)
            np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-15, err_msg=f"{name}: {column}")
        else:
            assert a[column].tolist() == b[column].tolist(), f"{name}: {column}"


def naive(store, run, name, params):
    """The query computed without any kind's totals: tests/queries/reference.py's naive reference where it has one, else
    the documented means taken over the kept per-example fields (`summary.summary`, read whole)."""
    if name not in ("norm_attention", "attention_attribution"):
        return reference.query(store, name, run=run, **params)
    info = store.run_info(run)
    frame = run_query(store, name, run=run, **params)  # its layer / head columns and column order
    if name == "norm_attention":
        fields = summary.summary(store, info, NORM_CLASSES)
        length = fields["length"].astype(float)[:, None, None]
        for c in ("cls", "sep", "punct", "other"):
            for kind in ("weight", "contribution", "share"):
                frame[f"{kind}_{c}"] = (fields[f"{kind}_{c}"] / length).mean(0).ravel()
            has = fields[f"n_{c}"] > 0
            mean_norms = fields[f"norm_{c}"][has] / fields[f"n_{c}"][has][:, None, None]
            frame[f"norm_{c}"] = mean_norms.mean(0).ravel() if has.any() else np.nan  # no example with such a token: NaN
        return frame
    fields = summary.summary(store, info, ATTRIBUTION_TAU, **params)
    with np.errstate(invalid="ignore"):
        for k in ("tau", "tau_norm", "tau_random"):
            frame[k] = np.nanmean(fields[k], axis=0).ravel()
        frame["tau_sd"] = np.nanstd(fields["tau"], axis=0, ddof=1).ravel()
        frame["n_examples"] = (~np.isnan(fields["tau"])).sum(0).ravel()
        frame["tau_rollout"] = np.repeat(np.nanmean(fields["tau_rollout"], axis=0)[:, None], info.n_heads, axis=1).ravel()
    return frame


def test_range_path_equals_per_example_path_and_reads_no_example_once_kept(store, ranged_run, monkeypatch):
    load_all()
    monkeypatch.setattr("attnstore.queries.engine.kinds.SUMMARY_RANGE", 2)
    ranged = [run_query(store, name, run=ranged_run, **params) for name, params in CASES]  # builds summaries and ranges
    info = store.run_info(ranged_run)
    for kind, params in KINDS:
        kept = kept_ranges(store, info, kind, **params)
        assert kept is not None and kept.n == 4, kind.name
        assert kept.block(0, 4)["range_examples"].tolist() == [2, 2, 2, 1]
    with summary.per_example_totals():
        per_example = [run_query(store, name, run=ranged_run, **params) for name, params in CASES]
    for (name, params), a, b in zip(CASES, ranged, per_example):
        values = a.select_dtypes("number").drop(columns=["layer", "head"], errors="ignore").to_numpy(float)
        assert values.size and np.nan_to_num(values).any(), f"{name} {params}: nothing to compare"
        frames_close(a, b, f"{name} {params}")
        rtol = NORM_RTOL if params.get("weights") == "norm" else REFERENCE_RTOL
        frames_close(a, naive(store, ranged_run, name, params), f"{name} {params} against the naive reference", rtol)

    def refuse(*args, **kwargs):
        raise AssertionError("a whole-run query read per-example fields although ranges are kept")

    monkeypatch.setattr("attnstore.queries.engine.kept._summary_parts", refuse)
    for (name, params), first in zip(CASES, ranged):
        again = run_query(store, name, run=ranged_run, **params)
        frames_close(again, first, f"{name} {params} again")


def test_a_subset_adds_each_parts_totals(store, ranged_run, make_run, monkeypatch):
    """examples= takes the per-example path: the numbers of a run of those examples alone."""
    load_all()
    monkeypatch.setattr("attnstore.queries.engine.kinds.SUMMARY_RANGE", 2)
    subset = [0, 4, 5]
    rng = np.random.default_rng(11)
    chosen = [SHAPES[i % 3] for i in range(N_EXAMPLES)]
    norms = [(rng.random((3, 2, len(t))) * 3 + 0.1).astype(np.float16).astype(np.float32) for t, _, _ in chosen]
    alone = make_run(
        store,
        [random_maps(len(chosen[i][0]), i, 3, 2) for i in subset],
        [chosen[i][0] for i in subset],
        name="alone",
        dtype="float16",
        words_list=[chosen[i][1] for i in subset],
        token_words=[chosen[i][2] for i in subset],
        norms_list=[norms[i] for i in subset],
    )
    for name, params in CASES:
        if name in ("attention_attribution", "head_clusters"):
            continue  # the saliency is the full run's; MDS coordinates are defined up to a reflection
        of_subset = run_query(store, name, run=ranged_run, examples=subset, **params)
        frames_close(of_subset, run_query(store, name, run=alone, **params), f"{name} {params}")
