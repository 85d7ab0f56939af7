"""head_match's positional null (queries/head_match.py `position_template`): a head's template from position alone,
checked against values worked by hand; the query's `position_null` against a naive per-example computation; and the
test itself on hand-built runs: heads that correspond in every example pass it, heads whose labels are shuffled from
example to example (each head of B is each head of A as often as any other) fail it."""

from __future__ import annotations

import numpy as np
import pytest

from attnstore.queries import run_query
from attnstore.queries.head_match import distances, paired_distances, position_template
from attnstore.tests.queries.helpers import hand_run, write_blocks
from attnstore.tests.queries.test_head_match import SPECIALS, a_tokens, naive_js, naive_rows, token_rows

N_WORDS, N_HEADS, N_EXAMPLES = 5, 6, 12
UNITS = N_WORDS + 2  # [CLS], five words, [SEP]


def test_the_template_of_two_words_with_special_units():
    """Units [start, sep, w0, w1], one token each: even attention gives every unit 1/4. Row 0: start .5, sep .1, same
    .2, next .2 (no previous word); row 1: start .3, sep .3, previous .4, same 0 (no next word). Share over even
    attention's on the same rows: start .8/.5 = 1.6, sep .4/.5 = .8, previous .4/.25 = 1.6 (row 1 alone), same
    .2/.5 = .4, next .2/.25 = .8 (row 0 alone); each row takes its parts' ratios, renormalised."""
    x = np.array([[[0.5, 0.1, 0.2, 0.2], [0.3, 0.3, 0.4, 0.0]]])
    got = position_template(x, "keep", causal=False)
    want = np.array([[[1.6, 0.8, 0.4, 0.8], [1.6, 0.8, 1.6, 0.4]]])
    np.testing.assert_allclose(got, want / want.sum(-1, keepdims=True), atol=1e-15)


def test_the_template_of_three_words_without_special_units():
    """Units [w0, w1, w2], even 1/3 each. previous (rows 1, 2) .4/(2/3) = .6, same 1.2/1 = 1.2, next (rows 0, 1)
    .6/(2/3) = .9, other words (w2 for row 0, w0 for row 2) .8/(2/3) = 1.2."""
    x = np.array([[[0.6, 0.3, 0.1], [0.2, 0.5, 0.3], [0.7, 0.2, 0.1]]])
    got = position_template(x, "drop", causal=False)
    want = np.array([[[1.2, 0.9, 1.2], [0.6, 1.2, 0.9], [1.2, 0.6, 1.2]]])
    np.testing.assert_allclose(got, want / want.sum(-1, keepdims=True), atol=1e-15)


def test_the_template_weighs_units_by_their_tokens():
    """Units [start, sep, w0, w1, w2] with 1, 2, 1, 3, 1 tokens (8): even attention gives w1 3/8, w0 and w2 1/8.
    Row 0 (word 0) attends evenly over the tokens: the head's shares are even attention's (every ratio 1), so the
    row is its own template; row 1 is empty and stays so."""
    tokens = np.array([1, 2, 1, 3, 1])
    x = np.zeros((1, 3, 5))
    x[0, 0] = tokens / 8
    got = position_template(x, "keep", causal=False, unit_tokens=tokens)
    np.testing.assert_allclose(got, x, atol=1e-15)
    assert (got[0, 1:] == 0).all()


def test_a_causal_template_sees_what_its_row_sees():
    """Causal: a row has the start unit and the words up to itself (no separator, no next word): even attention gives
    row 0 1/2 on start and w0, row 1 1/3 on start, w0, w1. start .7/(5/6) = .84, previous .3/(1/3) = .9 (row 1),
    same 1/(5/6) = 1.2."""
    x = np.array([[[0.5, 0.0, 0.5, 0.0], [0.2, 0.0, 0.3, 0.5]]])
    got = position_template(x, "keep", causal=True)
    want = np.array([[[0.84, 0.0, 1.2, 0.0], [0.84, 0.0, 0.9, 1.2]]])
    np.testing.assert_allclose(got, want / want.sum(-1, keepdims=True), atol=1e-15)


def test_a_positional_head_is_its_own_template_and_a_zero_row_stays_zero():
    x = np.zeros((1, 3, 5))
    x[0, 1, 2], x[0, 2, 3] = 1.0, 1.0  # words 1 and 2 attend to the previous word; word 0's row is empty
    got = position_template(x, "keep", causal=False)
    np.testing.assert_array_equal(got, x)
    assert paired_distances(x, got, "js")[0] == 0.0


@pytest.mark.parametrize("metric", ["js", "cosine", "frobenius"])
def test_paired_distances_are_the_diagonal_of_distances(metric):
    rng = np.random.default_rng(3)
    x, y = rng.random((2, 4, 3, 5)) ** 3
    x, y = x / x.sum(-1, keepdims=True), y / y.sum(-1, keepdims=True)
    x[1, 0] = 0.0  # a row that is not a distribution
    np.testing.assert_allclose(paired_distances(x, y, metric), np.diag(distances(x, y, metric)), rtol=1e-12)


def peaked_units(example: int) -> np.ndarray:
    """(heads, units, units) exact maps: head k of A puts 0.8 of every row on unit (k + example) mod 7 and spreads 0.2
    evenly over the six others: which unit depends on the head and the example, not on the query's position."""
    maps = np.full((N_HEADS, UNITS, UNITS), 0.2 / (UNITS - 1))
    for k in range(N_HEADS):
        maps[k, :, (k + example) % UNITS] = 0.8
    return maps


def pair_of_runs(store, make_run, shift_per_example: int):
    """Run A (1 x 6 heads, `peaked_units`) and run B over the same examples and tokens, whose head k in example e is A's
    head (k + shift_per_example * e) mod 6: a shift of 0 keeps every head's counterpart; a shift of 1 cycles B's labels
    so that over the 12 examples each head of B is each head of A twice."""
    units = [peaked_units(e) for e in range(N_EXAMPLES)]
    a = make_run(store, [u[None].astype(np.float32) for u in units], [a_tokens(N_WORDS)] * N_EXAMPLES, name="A")
    info = store.run_info(a)
    b = hand_run(store, "B", dataset_id=info.dataset_id, n_layers=1, n_heads=N_HEADS, dtype="float32", specials=SPECIALS)
    ids = store.examples(a).set_index("example")["example_id"]
    rows = token_rows(a_tokens(N_WORDS), [None, *range(N_WORDS), None])
    order = (np.arange(N_HEADS) + 2) % N_HEADS  # B's head k is A's head order[k] (shifted on by the example)
    write_blocks(
        store,
        b.id,
        [(ids[e], units[e][(order + shift_per_example * e) % N_HEADS][None].astype(np.float32), rows) for e in range(N_EXAMPLES)],
    )
    return a, "B"


@pytest.mark.one_backend
def test_heads_that_correspond_in_every_example_pass_the_positional_null(store, make_run):
    a, b = pair_of_runs(store, make_run, shift_per_example=0)
    frame = run_query(store, "head_match", run=a, other=b)
    matched = frame["match_head"].astype(int).to_numpy()
    assert ((matched + 2) % N_HEADS == np.arange(N_HEADS)).all()  # B's head k is A's head k + 2
    np.testing.assert_allclose(frame["distance"], 0, atol=1e-12)
    assert (frame["position_p"] < 0.01 / N_HEADS).all() and (frame["position_z"] > 3).all()
    # position_null: the mean over examples of each head's JS divergence from its template, computed from the stored maps
    want = np.zeros(N_HEADS)
    for example in range(N_EXAMPLES):
        x = naive_rows(store, a, example, list(range(N_WORDS)))
        template = position_template(x, "keep", causal=False)
        want += [naive_js(x[k], template[k]) for k in range(N_HEADS)]
    np.testing.assert_allclose(frame["position_null"], want / N_EXAMPLES, rtol=1e-9)
    matrix = run_query(store, "head_match_matrix", run=a, other=b)
    np.testing.assert_allclose(matrix.groupby("head")["position_null"].first(), want / N_EXAMPLES, rtol=1e-9)


@pytest.mark.one_backend
def test_heads_shuffled_from_example_to_example_fail_it(store, make_run):
    """Every head of B is every head of A in 2 of the 12 examples: a match is no closer to A's head than A's
    positional template, so none passes the positional null."""
    a, b = pair_of_runs(store, make_run, shift_per_example=1)
    frame = run_query(store, "head_match", run=a, other=b)
    assert frame["distance"].notna().all() and (frame["distance"] > frame["position_null"]).all()
    assert not (frame["position_p"] < 0.01 / N_HEADS).any() and (frame["position_z"] < 0).all()
