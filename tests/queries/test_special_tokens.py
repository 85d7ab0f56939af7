import numpy as np

from attnstore.queries import run_query


def column(frame, name):
    return frame.sort_values(["layer", "head"])[name].to_numpy()


def test_special_tokens_exact_values(store, hand_run):
    df = run_query(store, "special_tokens", run=hand_run)
    assert list(df.columns) == ["layer", "head", "to_cls", "to_sep", "to_punct", "to_other", "sep_from_sep", "sep_from_other"]
    # 8 query tokens in all; rows: L0H0, L0H1, L1H0, L1H1 (see conftest.hand_maps)
    np.testing.assert_allclose(column(df, "to_cls"), [1.0, 4 / 8, 2 / 8, 0.0], atol=1e-6)
    np.testing.assert_allclose(column(df, "to_sep"), [0.0, 0.0, 2 / 8, 1.0], atol=1e-6)
    np.testing.assert_allclose(column(df, "to_punct"), [0.0, 1 / 8, 1 / 8, 0.0], atol=1e-6)
    np.testing.assert_allclose(column(df, "to_other"), [0.0, 3 / 8, 3 / 8, 0.0], atol=1e-6)
    np.testing.assert_allclose(column(df, "sep_from_sep"), [0.0, 0.0, (1 / 5 + 1 / 3) / 2, 1.0], atol=1e-6)
    np.testing.assert_allclose(column(df, "sep_from_other"), [0.0, 0.0, (4 / 5 + 2 / 3) / 6, 1.0], atol=1e-6)
    shares = df[["to_cls", "to_sep", "to_punct", "to_other"]].sum(axis=1)
    np.testing.assert_allclose(shares, 1.0, atol=1e-6)


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
    np.testing.assert_allclose(column(df, "to_other")[2], 4 / 8, atol=1e-6)


def test_subset_of_examples(store, hand_run):
    df = run_query(store, "special_tokens", run=hand_run, examples=[1])
    # only the L=3 example: uniform head gives 1/3 to [CLS]
    np.testing.assert_allclose(column(df, "to_cls")[2], 1 / 3, atol=1e-6)
