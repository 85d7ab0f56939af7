"""K3 `run_similarity`: two runs over the same examples, matched by example id, exact cosines by hand."""

import numpy as np
import pytest

from attnstore.queries import run_query
from attnstore.store.errors import InvalidArgumentError, NotFoundError
from attnstore.tests.queries.helpers import hand_run, write_blocks

TOKENS = [["[CLS]", "x", "[SEP]"], ["[CLS]", "[SEP]"]]
SPECIALS = {"cls": {"token": "[CLS]", "id": 101}, "sep": {"token": "[SEP]", "id": 102}}


def first_run_maps():
    """1 layer x 2 heads. Example 0 (L=3): head 0 the identity, head 1 all to [CLS]. Example 1 (L=2): identity; all to [CLS]."""
    e0 = np.stack([np.eye(3), np.tile([1.0, 0, 0], (3, 1))])[None].astype(np.float32)
    e1 = np.stack([np.eye(2), np.tile([1.0, 0], (2, 1))])[None].astype(np.float32)
    return [e0, e1]


def second_run_maps():
    """Example 0: head 0 the identity again (cosine 1), head 1 all to token 1 (disjoint: cosine 0).
    Example 1: head 0 uniform 1/2 (cosine (1/2 + 1/2) / (sqrt(2) * 1) = 1/sqrt(2)), head 1 all to [CLS] (cosine 1)."""
    e0 = np.stack([np.eye(3), np.tile([0, 1.0, 0], (3, 1))])[None].astype(np.float32)
    e1 = np.stack([np.full((2, 2), 0.5), np.tile([1.0, 0], (2, 1))])[None].astype(np.float32)
    return [e0, e1]


def add_run(store, base_run, name, maps_list, *, order=(1, 0), token_ids=None):
    """Another run over the dataset of `base_run`, its examples written in `order` (storage order differs from base)."""
    info = store.run_info(base_run)
    n_layers, n_heads = maps_list[0].shape[:2]
    run = hand_run(store, name, dataset_id=info.dataset_id, n_layers=n_layers, n_heads=n_heads, dtype="float32", specials=SPECIALS)
    ids = store.examples(base_run).set_index("example")["example_id"]
    blocks = []
    for position in order:
        toks = TOKENS[position]
        rows = [
            dict(
                token=t,
                token_id=(token_ids or {}).get(
                    (position, k), SPECIALS["cls"]["id"] if t == "[CLS]" else SPECIALS["sep"]["id"] if t == "[SEP]" else 1000 + len(t)
                ),
                word_position=None if t.startswith("[") else 0,
                segment=0,
                is_special=t.startswith("["),
                char_start=None,
                char_end=None,
            )
            for k, t in enumerate(toks)
        ]
        blocks.append((ids[position], maps_list[position], rows))
    write_blocks(store, run.id, blocks)
    return name


@pytest.fixture
def two_runs(store, make_run):
    base = make_run(store, first_run_maps(), TOKENS, name="pretrained", specials=SPECIALS)
    return base, add_run(store, base, "finetuned", second_run_maps())


def test_run_similarity_exact_cosines(store, two_runs):
    base, other = two_runs
    df = run_query(store, "run_similarity", run=base, other=other)
    assert list(df.columns) == ["layer", "head", "similarity", "n_examples"]
    np.testing.assert_allclose(df.sort_values("head")["similarity"], [(1 + 1 / np.sqrt(2)) / 2, (0 + 1) / 2], atol=1e-6)
    assert (df["n_examples"] == 2).all()
    # symmetric, and the runs' different storage orders do not pair the wrong examples
    back = run_query(store, "run_similarity", run=other, other=base)
    np.testing.assert_allclose(back.sort_values("head")["similarity"], df.sort_values("head")["similarity"], atol=1e-6)


def test_examples_and_max_examples(store, two_runs):
    base, other = two_runs
    one = run_query(store, "run_similarity", run=base, other=other, examples=[1])
    np.testing.assert_allclose(one.sort_values("head")["similarity"], [1 / np.sqrt(2), 1.0], atol=1e-6)
    sampled = run_query(store, "run_similarity", run=base, other=other, max_examples=1, seed=3)
    assert (sampled["n_examples"] == 1).all()
    per_example = {0: [1.0, 0.0], 1: [1 / np.sqrt(2), 1.0]}
    assert any(np.allclose(sampled.sort_values("head")["similarity"], v, atol=1e-6) for v in per_example.values())
    with pytest.raises(NotFoundError, match=r"example\(s\) \[5\] are not stored in both runs"):
        run_query(store, "run_similarity", run=base, other=other, examples=[5])


def test_the_whole_pair_adds_kept_ranges_without_the_example_rows(store, two_runs, monkeypatch):
    """With ranges of one example, the pair's cosines are kept summed per range; a whole-run call adds those rows and
    reads neither the runs' example rows nor a per-example cosine once they are kept; a sample still reads its rows."""
    from attnstore.queries import engine as summary
    from attnstore.queries import run_similarity as module

    base, other = two_runs
    monkeypatch.setattr("attnstore.queries.engine.kinds.SUMMARY_RANGE", 1)
    first = run_query(store, "run_similarity", run=base, other=other)
    kept = summary.kept_ranges(store, store.run_info(base), module.PAIR_COSINES, other=other)
    assert kept is not None and kept.n == 2 and kept.n_examples() == 2
    np.testing.assert_allclose(first.sort_values("head")["similarity"], [(1 + 1 / np.sqrt(2)) / 2, 0.5], atol=1e-6)

    def refuse(*args, **kwargs):
        raise AssertionError("read per-example rows although the ranges are kept")

    with monkeypatch.context() as m:
        m.setattr("attnstore.queries.engine.kept._summary_parts", refuse)
        m.setattr(module, "shared_examples", refuse)
        for max_examples in (1000, None, 2):
            again = run_query(store, "run_similarity", run=base, other=other, max_examples=max_examples)
            np.testing.assert_array_equal(again["similarity"], first["similarity"])
    assert (run_query(store, "run_similarity", run=base, other=other, max_examples=1)["n_examples"] == 1).all()
    with pytest.raises(InvalidArgumentError, match="max_examples must be at least 1, not 0"):  # kept ranges or not
        run_query(store, "run_similarity", run=base, other=other, max_examples=0)


def test_runs_over_different_datasets_are_refused(store, two_runs, make_run):
    base, _ = two_runs
    elsewhere = make_run(store, first_run_maps(), TOKENS, name="elsewhere", specials=SPECIALS)
    with pytest.raises(InvalidArgumentError, match="share no dataset"):
        run_query(store, "run_similarity", run=base, other=elsewhere)


def test_different_token_ids_are_refused_naming_the_example(store, two_runs):
    base, _ = two_runs
    retok = add_run(store, base, "retokenised", second_run_maps(), token_ids={(0, 1): 7})
    with pytest.raises(InvalidArgumentError, match=r"tokenised example 0 differently: token 1 is 'x' \(id 1001\) in 'pretrained'"):
        run_query(store, "run_similarity", run=base, other=retok)


def test_different_model_shapes_are_refused(store, two_runs):
    base, _ = two_runs
    wide = [np.concatenate([m, m], axis=1) for m in second_run_maps()]
    other = add_run(store, base, "wide", wide)
    with pytest.raises(InvalidArgumentError, match="differently shaped models"):
        run_query(store, "run_similarity", run=base, other=other)
