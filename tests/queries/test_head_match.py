"""Cross-model head matching (`head_match`, `head_match_matrix`) on hand-built runs over one dataset: a model whose heads
are another's in a different order (and layers x heads), tokenised differently and truncated, is matched back exactly
with distance 0; every distance equals a naive per-row computation written here; the null and the test behave."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from attnstore.queries import run_query
from attnstore.queries.errors import InvalidArgumentError
from attnstore.tests.queries.helpers import hand_run, write_blocks

# The analysis, not the database: SQLite only (kept summaries are Zarr; each query's SQL meets PostgreSQL in test_conformance.py).
pytestmark = pytest.mark.one_backend

SPECIALS = {"cls": {"token": "[CLS]", "id": 101}, "sep": {"token": "[SEP]", "id": 102}}
WORD_COUNTS = (3, 5, 4, 6, 5, 2, 7)  # one example per entry
PERMUTATION = np.array([4, 0, 5, 2, 1, 3])  # head k of B is head PERMUTATION[k] of A (A: 2 x 3, B: 3 x 2)


def unit_distributions(rng, n_words: int, n_heads: int) -> np.ndarray:
    """(heads, units, units) random rows over [CLS] + words + [SEP], no zero."""
    raw = rng.random((n_heads, n_words + 2, n_words + 2)) ** 3 + 1e-3
    return raw / raw.sum(-1, keepdims=True)


def a_tokens(n_words: int) -> list[str]:
    return ["[CLS]", *(f"w{i}" for i in range(n_words)), "[SEP]"]


def pieces_of(n_words: int, example: int) -> list[int]:
    """B's tokenizer: word i gets 1 or 2 pieces (seeded by the example)."""
    return [1 + (i + example) % 2 for i in range(n_words)]


def b_token_maps(units: np.ndarray, pieces: list[int]) -> tuple[np.ndarray, list[str], list]:
    """Token maps whose word-level maps (to a word: its pieces summed; from a word: its pieces averaged) are `units`:
    each piece of a word repeats the word's row, and a key word's weight is split evenly over its pieces."""
    spans = [1, *pieces, 1]  # [CLS], words, [SEP]
    owner = np.repeat(np.arange(len(spans)), spans)
    split = units[:, owner][:, :, owner] / np.array(spans)[owner][None, None, :]
    tokens = ["[CLS]"] + [f"p{i}{'' if k == 0 else '##'}" for i, n in enumerate(pieces) for k in range(n)] + ["[SEP]"]
    words = [None] + [i for i, n in enumerate(pieces) for _ in range(n)] + [None]
    return split, tokens, words


def token_rows(tokens: list[str], words: list) -> list[dict]:
    ids = {v["token"]: v["id"] for v in SPECIALS.values()}
    return [
        dict(token=t, token_id=ids.get(t, 1000 + k), word_position=w, segment=0, is_special=w is None, char_start=None, char_end=None)
        for k, (t, w) in enumerate(zip(tokens, words))
    ]


@pytest.fixture
def pair(store, make_run):
    """Run A (2 x 3 heads, one token per word) and run B (3 x 2 heads, words split into pieces, its heads A's permuted);
    B cuts the last word of example 3 (truncation): both runs are compared without it."""
    rng = np.random.default_rng(0)
    units = [unit_distributions(rng, n, 6) for n in WORD_COUNTS]
    a = make_run(store, [u.reshape(2, 3, *u.shape[1:]).astype(np.float32) for u in units], [a_tokens(n) for n in WORD_COUNTS], name="A")
    info = store.run_info(a)
    b = hand_run(store, "B", dataset_id=info.dataset_id, n_layers=3, n_heads=2, dtype="float32", specials=SPECIALS)
    ids = store.examples(a).set_index("example")["example_id"]
    blocks = []
    for example in (4, 0, 6, 2, 5, 1, 3):  # another storage order
        u = units[example][PERMUTATION]
        n = WORD_COUNTS[example]
        if example == 3:  # the last word has no piece in B: drop its unit and renormalise, as the query will for A
            keep = [k for k in range(n + 2) if k != n]
            u = u[:, keep][:, :, keep]
            u = u / u.sum(-1, keepdims=True)
            n -= 1
        maps, tokens, words = b_token_maps(u, pieces_of(n, example))
        blocks.append((ids[example], maps.reshape(3, 2, *maps.shape[1:]).astype(np.float32), token_rows(tokens, words)))
    write_blocks(store, b.id, blocks)
    return a, "B", units


def naive_js(x: np.ndarray, y: np.ndarray) -> float:
    """Mean over rows of the Jensen-Shannon divergence (nats), by the textbook formula, one row at a time."""
    total = 0.0
    for p, q in zip(x, y):
        m = (p + q) / 2
        total += 0.5 * sum(pi * math.log(pi / mi) for pi, mi in zip(p, m) if pi > 0) + 0.5 * sum(
            qi * math.log(qi / mi) for qi, mi in zip(q, m) if qi > 0
        )
    return total / len(x)


def naive_rows(store, run: str, example: int, words: list[int]) -> np.ndarray:
    """(heads, words, units) from the stored token maps, one entry at a time: units [CLS], [SEP], then `words`; a word's
    row is the mean of its pieces' rows, a unit's column the sum of its tokens' columns; rows renormalised."""
    maps = store.attention(run, example).astype(np.float64)
    maps = maps.reshape(-1, *maps.shape[-2:])
    tokens = store.tokens(run, example)
    owner = []  # per token: its unit index, or None
    for t in tokens.itertuples():
        if t.token == "[CLS]":
            owner.append(0)
        elif t.token == "[SEP]":
            owner.append(1)
        else:
            w = int(t.word_position)
            owner.append(2 + words.index(w) if w in words else None)
    out = np.zeros((len(maps), len(words), len(words) + 2))
    for h in range(len(maps)):
        for i, w in enumerate(words):
            pieces = [k for k, t in enumerate(tokens.itertuples()) if t.token not in ("[CLS]", "[SEP]") and int(t.word_position) == w]
            for k in pieces:
                for j, unit in enumerate(owner):
                    if unit is not None:
                        out[h, i, unit] += maps[h, k, j] / len(pieces)
            out[h, i] /= out[h, i].sum()
    return out


def test_a_permutation_of_heads_is_recovered_with_distance_zero(store, pair):
    a, b, _ = pair
    frame = run_query(store, "head_match", run=a, other=b)
    assert list(frame.columns) == [
        "layer", "head", "match_layer", "match_head", "distance", "best_layer", "best_head", "best_distance", "margin",
        "rank", "row_z", "null_mean", "null_sd", "z", "p_value", "position_null", "position_z", "position_p", "n_examples",
    ]  # fmt: skip
    matched = frame["match_layer"].astype(int) * 2 + frame["match_head"].astype(int)  # B's flat head index
    assert (PERMUTATION[matched.to_numpy()] == np.arange(6)).all()  # B's head k is A's head PERMUTATION[k]
    np.testing.assert_allclose(frame["distance"], 0, atol=1e-12)
    assert (frame[["best_layer", "best_head"]].to_numpy() == frame[["match_layer", "match_head"]].astype(int).to_numpy()).all()
    assert (frame["margin"] > 0.01).all() and (frame["null_mean"] > 0.01).all() and (frame["n_examples"] == len(WORD_COUNTS)).all()
    assert (frame["z"] > 3).all() and (frame["p_value"] < 1e-3).all()  # far closer than unrelated sentences
    assert (frame["rank"] == 1).all() and (frame["row_z"] > 1).all()  # and the nearest of B's heads, well below the rest
    assert (frame["position_null"] > 0.01).all() and (frame["position_p"] < 1e-3).all()  # and closer than position alone


def test_every_distance_is_the_naive_one(store, pair):
    a, b, units = pair
    matrix = run_query(store, "head_match_matrix", run=a, other=b)
    assert len(matrix) == 36 and matrix.attrs["other"] == "B"
    got = matrix.pivot(index=["layer", "head"], columns=["other_layer", "other_head"], values="distance").to_numpy()
    expected = np.zeros((6, 6))
    for example, n in enumerate(WORD_COUNTS):
        words = list(range(n - 1 if example == 3 else n))  # B cut example 3's last word: dropped in both
        x, y = naive_rows(store, a, example, words), naive_rows(store, b, example, words)
        for i in range(6):
            for k in range(6):
                expected[i, k] += naive_js(x[i], y[k])
    np.testing.assert_allclose(got, expected / len(WORD_COUNTS), rtol=1e-12, atol=1e-14)


def test_a_run_against_itself_and_the_other_metrics(store, pair):
    a, b, _ = pair
    itself = run_query(store, "head_match", run=a, other=a)
    assert (itself["match_layer"].astype(int) == itself["layer"]).all() and (itself["match_head"].astype(int) == itself["head"]).all()
    np.testing.assert_allclose(itself["distance"], 0, atol=1e-12)
    for metric in ("cosine", "frobenius"):
        frame = run_query(store, "head_match", run=a, other=b, metric=metric)
        matched = frame["match_layer"].astype(int) * 2 + frame["match_head"].astype(int)
        assert (PERMUTATION[matched.to_numpy()] == np.arange(6)).all(), metric
        np.testing.assert_allclose(frame["distance"], 0, atol=1e-6)
    words_only = run_query(store, "head_match", run=a, other=b, specials="drop")
    np.testing.assert_allclose(words_only["distance"], 0, atol=1e-12)


def test_fewer_heads_in_b_leave_heads_of_a_unmatched(store, pair, make_run):
    a, _, units = pair
    info = store.run_info(a)
    small = hand_run(store, "small", dataset_id=info.dataset_id, n_layers=1, n_heads=2, dtype="float32", specials=SPECIALS)
    ids = store.examples(a).set_index("example")["example_id"]
    blocks = [
        (ids[e], units[e][[5, 1]][None].astype(np.float32), token_rows(a_tokens(n), [None, *range(n), None]))
        for e, n in enumerate(WORD_COUNTS)
    ]
    write_blocks(store, small.id, blocks)
    frame = run_query(store, "head_match", run=a, other="small").set_index(["layer", "head"])
    assert frame["match_head"].notna().sum() == 2
    assert (frame.loc[(1, 2), ["match_layer", "match_head"]].tolist(), frame.loc[(0, 1), ["match_layer", "match_head"]].tolist()) == (
        [0, 0],
        [0, 1],
    )
    assert frame.loc[(0, 0), "distance"] != frame.loc[(0, 0), "distance"]  # NaN: unmatched


def test_bad_input_is_one_line(store, pair, make_run):
    a, b, _ = pair
    with pytest.raises(InvalidArgumentError, match="name the other one"):
        run_query(store, "head_match", run=a)
    with pytest.raises(InvalidArgumentError, match="metric='l2': use 'js'"):
        run_query(store, "head_match", run=a, other=b, metric="l2")
    with pytest.raises(InvalidArgumentError, match="specials='none': use 'keep'"):
        run_query(store, "head_match_matrix", run=a, other=b, specials="none")
    elsewhere = make_run(store, [np.full((1, 1, 3, 3), 1 / 3, dtype=np.float32)], [a_tokens(1)], name="elsewhere")
    with pytest.raises(InvalidArgumentError, match="share no examples"):
        run_query(store, "head_match", run=a, other=elsewhere)


def test_profiles_of_permuted_heads_are_matched_back(store, pair):
    """A run whose heads are A's in another order, with A's tokens: every per-head metric is A's, permuted, so the
    functional match recovers the permutation at distance 0 (and agrees with the map-based one)."""
    a, _, units = pair
    info = store.run_info(a)
    c = hand_run(store, "C", dataset_id=info.dataset_id, n_layers=3, n_heads=2, dtype="float32", specials=SPECIALS)
    ids = store.examples(a).set_index("example")["example_id"]
    blocks = [
        (ids[e], units[e][PERMUTATION].reshape(3, 2, n + 2, n + 2).astype(np.float32), token_rows(a_tokens(n), [None, *range(n), None]))
        for e, n in enumerate(WORD_COUNTS)
    ]
    write_blocks(store, c.id, blocks)
    frame = run_query(store, "head_profile_match", run=a, other="C", profile="position,special,entropy", with_maps=True)
    matched = frame["match_layer"].astype(int) * 2 + frame["match_head"].astype(int)
    assert (PERMUTATION[matched.to_numpy()] == np.arange(6)).all()
    np.testing.assert_allclose(frame["distance"], 0, atol=1e-9)
    assert frame["agrees"].all() and "agree on 6 of 6 heads" in frame.attrs["note"]
    assert len(frame.attrs["features"]) == 8
    with pytest.raises(InvalidArgumentError, match="unknown profile"):
        run_query(store, "head_profile_match", run=a, other="C", profile="syntax")


def test_the_report_writes_the_table_and_both_figures(store, pair, tmp_path):
    pytest.importorskip("matplotlib")
    from click.testing import CliRunner

    from attnstore.api.cli import main

    a, b, _ = pair
    where = ["--db", store.locations.db_url, "--root", store.locations.array_root]
    result = CliRunner().invoke(main, ["report", "head-match", "--run", a, "--other", b, "--out", str(tmp_path), *where])
    assert result.exit_code == 0, result.output
    names = {p.name for p in tmp_path.iterdir()}
    assert {"README.md", "head_match.csv", "head_match_matrix.csv", "head_match_layers.csv"} <= names
    assert {"head_match_matrix.png", "head_match_matrix.svg", "head_match_layers.png", "head_match_layers.svg"} <= names
    text = (tmp_path / "README.md").read_text()
    assert "**6 of 6 heads of A have a one-to-one match that beats the positional null** at p < 0.01/6" in text
    assert "The sentence null" in text and "## What these numbers can and cannot claim" in text
    assert "the first time, this builds the pair's summary" in result.output
    layers = np.loadtxt(tmp_path / "head_match_layers.csv", delimiter=",", skiprows=1)
    assert layers.shape == (2, 6) and (layers[:, -1] == 3).all()  # each layer of A: its 3 heads matched


MATCHED_SQL = """
SELECT m.layer, m.head, m.match_layer, m.match_head, a.value AS to_previous_a, b.value AS to_previous_b
FROM head_matches m
JOIN runs ra ON ra.id = m.run_id
JOIN runs rb ON rb.id = m.other_run_id
JOIN head_metrics a ON a.run_id = m.run_id AND a.layer = m.layer AND a.head = m.head
JOIN head_metrics b ON b.run_id = m.other_run_id AND b.layer = m.match_layer AND b.head = m.match_head
WHERE ra.name = :a AND rb.name = :b
  AND a.metric = 'relative_position.to_previous' AND b.metric = 'relative_position.to_previous'
ORDER BY m.layer, m.head
"""


def test_save_writes_head_matches_that_sql_joins_with_head_metrics(store, pair):
    from click.testing import CliRunner

    from attnstore.api.cli import main

    a, b, _ = pair
    where = ["--db", store.locations.db_url, "--root", store.locations.array_root]
    result = CliRunner().invoke(main, ["query", "head_match", "--run", a, "--param", f"other={b}", "--save", "--format", "csv", *where])
    assert result.exit_code == 0, result.output
    assert f"saved 6 rows to head_matches (run {a!r} against {b!r})" in result.output
    again = CliRunner().invoke(main, ["query", "head_match", "--run", a, "--param", f"other={b}", "--save", *where])
    assert again.exit_code == 0, again.output  # saved again: replaced, not doubled
    saved = store.head_matches(a)
    assert len(saved) == 6 and set(saved["other"]) == {b} and saved["params"].iloc[0] == "{}"
    matched = saved["match_layer"].astype(int) * 2 + saved["match_head"].astype(int)
    assert (PERMUTATION[matched.to_numpy()] == np.arange(6)).all()
    for run in (a, b):
        store.save_head_metrics(run, run_query(store, "relative_position", run=run), prefix="relative_position")
    joined = store.sql(MATCHED_SQL, {"a": a, "b": b})
    assert len(joined) == 6 and joined[["layer", "head"]].values.tolist() == [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]


@pytest.mark.one_backend
def test_saved_matches_travel_in_a_bundle_with_both_runs(store, pair, tmp_path):
    from attnstore.store import migrate, open_store
    from attnstore.store.bundle import export_runs, import_bundle

    a, b, _ = pair
    store.save_head_matches(a, b, run_query(store, "head_match", run=a, other=b), {"metric": "js"})
    export_runs(store, [a], str(tmp_path / "only-a.zip"))  # B not exported: its matches stay behind
    export_runs(store, [a, b], str(tmp_path / "both.zip"))
    url = f"sqlite:///{tmp_path / 'copy.sqlite'}"
    migrate.upgrade(url)
    copy = open_store(db=url, root=str(tmp_path / "copy.zarr"))
    try:
        import_bundle(copy, str(tmp_path / "only-a.zip"))
        assert copy.head_matches().empty
        import_bundle(copy, str(tmp_path / "both.zip"))
        moved = copy.head_matches()
        assert len(moved) == 6 and set(moved["run"]) == {a} and set(moved["other"]) == {b}
        assert moved.drop(columns=["run", "other"]).equals(store.head_matches(a).drop(columns=["run", "other"]))
    finally:
        copy.close()


def test_whole_run_queries_add_kept_ranges_equal_to_example_by_example_sums(store, pair, monkeypatch):
    """The pair's totals are kept per range (2 examples here: 4 ranges for 7); a whole-run query adds those rows, equal
    to the per-example route and to sums taken one example at a time, and reads no example's matrices once they are kept.
    """
    from attnstore.queries import engine as summary
    from attnstore.queries.head_match import HEAD_MATCH

    a, b, _ = pair
    monkeypatch.setattr("attnstore.queries.engine.kinds.SUMMARY_RANGE", 2)
    first = [run_query(store, name, run=a, other=b) for name in ("head_match", "head_match_matrix")]
    info = store.run_info(a)
    kept = summary.kept_ranges(store, info, HEAD_MATCH, other=b)
    assert kept is not None and kept.block(0, kept.n)["range_examples"].tolist() == [2, 2, 2, 1]
    with summary.per_example_totals():
        per_example = [run_query(store, name, run=a, other=b) for name in ("head_match", "head_match_matrix")]
    for got, want in zip(first, per_example):
        pd.testing.assert_frame_equal(got, want, rtol=1e-12)
    fields = summary.summary(store, info, HEAD_MATCH, other=b)  # sums one example at a time, as the query once took them
    real, n_real, null, n_null = (np.zeros(fields["distance"].shape[1:]) for _ in range(4))
    for r, s in zip(fields["distance"], fields["null"]):
        seen, both = ~np.isnan(r), ~np.isnan(r) & ~np.isnan(s)
        real, n_real = real + np.where(seen, r, 0), n_real + seen
        null, n_null = null + np.where(both, s, 0), n_null + both
    matrix = first[1]
    np.testing.assert_allclose(matrix["distance"], (real / n_real).ravel(), rtol=1e-12)
    np.testing.assert_allclose(matrix["null_mean"], (null / n_null).ravel(), rtol=1e-12)
    assert len(fields["example"]) == 7 and (matrix["n_examples"] == 7).all()

    def refuse(*args, **kwargs):
        raise AssertionError("a whole-run query read per-example fields although ranges are kept")

    monkeypatch.setattr("attnstore.queries.engine.kept._summary_parts", refuse)
    for name, want in zip(("head_match", "head_match_matrix"), first):
        pd.testing.assert_frame_equal(run_query(store, name, run=a, other=b), want)
