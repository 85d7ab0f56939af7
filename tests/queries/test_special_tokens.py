import numpy as np
import pytest

from attnstore.queries import run_query
from attnstore.queries.errors import InvalidArgumentError


def column(frame, name):
    return frame.sort_values(["layer", "head"])[name].to_numpy()


def per(x5, x3):
    """Mean over the two examples of per-example means (L=5 and L=3 query tokens)."""
    return (x5 / 5 + x3 / 3) / 2


def test_special_tokens_per_example_exact_values(store, hand_run):
    """Default (Clark et al.'s code): each example's mean over its query tokens, then the mean over examples."""
    df = run_query(store, "special_tokens", run=hand_run)
    assert list(df.columns) == ["layer", "head", "to_cls", "to_sep", "to_punct", "to_other", "sep_from_sep", "sep_from_other"]
    # rows: L0H0, L0H1, L1H0, L1H1 (see conftest.hand_maps); examples [CLS] a , b [SEP] and [CLS] c [SEP]
    np.testing.assert_allclose(column(df, "to_cls"), [1.0, per(2, 2), per(1, 1), 0.0], atol=1e-6)
    np.testing.assert_allclose(column(df, "to_sep"), [0.0, 0.0, per(1, 1), 1.0], atol=1e-6)
    np.testing.assert_allclose(column(df, "to_punct"), [0.0, per(1, 0), per(1, 0), 0.0], atol=1e-6)
    np.testing.assert_allclose(column(df, "to_other"), [0.0, per(2, 1), per(2, 1), 0.0], atol=1e-6)
    # one [SEP] per example: its own attention to [SEP], then the mean over examples
    np.testing.assert_allclose(column(df, "sep_from_sep"), [0.0, 0.0, per(1, 1), 1.0], atol=1e-6)
    # the other queries' mean attention to [SEP] within each example (1/L each in the uniform head)
    np.testing.assert_allclose(column(df, "sep_from_other"), [0.0, 0.0, per(1, 1), 1.0], atol=1e-6)
    shares = df[["to_cls", "to_sep", "to_punct", "to_other"]].sum(axis=1)
    np.testing.assert_allclose(shares, 1.0, atol=1e-6)


def test_special_tokens_pooled_exact_values(store, hand_run):
    df = run_query(store, "special_tokens", run=hand_run, average="token")
    # 8 query tokens in all; rows: L0H0, L0H1, L1H0, L1H1 (see conftest.hand_maps)
    np.testing.assert_allclose(column(df, "to_cls"), [1.0, 4 / 8, 2 / 8, 0.0], atol=1e-6)
    np.testing.assert_allclose(column(df, "to_sep"), [0.0, 0.0, 2 / 8, 1.0], atol=1e-6)
    np.testing.assert_allclose(column(df, "to_punct"), [0.0, 1 / 8, 1 / 8, 0.0], atol=1e-6)
    np.testing.assert_allclose(column(df, "to_other"), [0.0, 3 / 8, 3 / 8, 0.0], atol=1e-6)
    np.testing.assert_allclose(column(df, "sep_from_sep"), [0.0, 0.0, (1 / 5 + 1 / 3) / 2, 1.0], atol=1e-6)
    np.testing.assert_allclose(column(df, "sep_from_other"), [0.0, 0.0, (4 / 5 + 2 / 3) / 6, 1.0], atol=1e-6)
    shares = df[["to_cls", "to_sep", "to_punct", "to_other"]].sum(axis=1)
    np.testing.assert_allclose(shares, 1.0, atol=1e-6)


def test_examples_without_separator_are_left_out_of_sep_from_sep(store, make_run, hand_maps):
    """sep_from_sep averages over the examples that have a separator, sep_from_other over those with other tokens."""
    run = make_run(store, [hand_maps(4), hand_maps(2)], [["[CLS]", "x", "y", "[SEP]"], ["[CLS]", "z"]], name="nosep")
    df = run_query(store, "special_tokens", run=run)
    # uniform head L1H0: only the L=4 example has a [SEP] (1/4 from it); from other tokens: 1/4 and 0 (no [SEP])
    assert column(df, "sep_from_sep")[2] == pytest.approx(1 / 4)
    assert column(df, "sep_from_other")[2] == pytest.approx((1 / 4 + 0) / 2)


def test_special_tokens_use_recorded_ids_not_strings(store, make_run, hand_maps):
    """RoBERTa-style specials (<s>, </s> as bos/eos): found by the recorded ids, no [CLS]/[SEP] strings."""
    specials = {"bos": {"token": "<s>", "id": 0}, "eos": {"token": "</s>", "id": 2}}
    run = make_run(store, [hand_maps(3)], [["<s>", "x", "</s>"]], name="roberta-like", specials=specials)
    df = run_query(store, "special_tokens", run=run)
    np.testing.assert_allclose(column(df, "to_cls"), [1.0, 2 / 3, 1 / 3, 0.0], atol=1e-6)
    np.testing.assert_allclose(column(df, "to_sep"), [0.0, 0.0, 1 / 3, 1.0], atol=1e-6)


def test_punct_parameter(store, hand_run):
    df = run_query(store, "special_tokens", run=hand_run, punct=";")
    np.testing.assert_allclose(column(df, "to_punct"), 0.0)
    np.testing.assert_allclose(column(df, "to_other")[2], per(3, 1), atol=1e-6)
    pooled = run_query(store, "special_tokens", run=hand_run, punct=";", average="token")
    np.testing.assert_allclose(column(pooled, "to_other")[2], 4 / 8, atol=1e-6)


def test_subset_of_examples(store, hand_run):
    df = run_query(store, "special_tokens", run=hand_run, examples=[1])
    # only the L=3 example: uniform head gives 1/3 to [CLS]
    np.testing.assert_allclose(column(df, "to_cls")[2], 1 / 3, atol=1e-6)


def test_unknown_average_is_refused(store, hand_run):
    with pytest.raises(InvalidArgumentError, match="average="):
        run_query(store, "special_tokens", run=hand_run, average="sentence")


def test_a_run_without_cls_or_separators_says_its_columns_measure_nothing(store, make_run):
    """A decoder's tokens (GPT-2 adds no [CLS] or [SEP]): to_cls and to_sep are 0 for every head by construction; the
    frame says so instead of showing a table of zeros as a finding."""
    tokens = [["The", "cat", "sat", "."], ["A", "dog", "."]]
    maps = [np.tril(np.ones((1, 2, len(t), len(t)), dtype=np.float32)) for t in tokens]
    maps = [m / m.sum(-1, keepdims=True) for m in maps]
    run = make_run(store, maps, tokens, name="decoder-like")
    frame = run_query(store, "special_tokens", run=run)
    assert (frame["to_cls"] == 0).all() and (frame["to_sep"] == 0).all()
    assert frame.attrs["note"] == (
        "the run's tokens include no [CLS]-like and no separator token (its tokenizer adds none), so to_cls and "
        "to_sep, sep_from_sep are 0 or empty by construction: they measure nothing here"
    )
    with_specials = make_run(store, [np.full((1, 2, 3, 3), 1 / 3, np.float32)], [["[CLS]", "a", "[SEP]"]], name="encoder")
    assert "note" not in run_query(store, "special_tokens", run=with_specials).attrs
