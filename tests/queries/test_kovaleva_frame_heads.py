"""K2 `frame_heads` on hand-built FrameNet-style annotation sets, expected values worked out by hand: under the
authors' notebook's selection (the default) and the project's earlier one (`EARLIER`)."""

import numpy as np
import pytest

from attnstore.queries import run_query
from attnstore.queries.frame_heads import span_distance
from attnstore.store.errors import InvalidArgumentError
from attnstore.tests.queries.helpers import frame_dataset, hand_run, positions_to_ids, token_rows, write_blocks

SPECIALS = {"cls": {"token": "[CLS]", "id": 101}, "sep": {"token": "[SEP]", "id": 102}}
# The project's selection before issue 26: coreType Core, core FEs at least 2 words from the target, any target.
EARLIER = dict(core="type", min_distance=2, distance_to="core", one_word_target=False)


def fe(name, start, end, core_type="Core", in_core_set=True):
    return dict(name=name, core_type=core_type, in_core_set=in_core_set, word_start=start, word_end=end, char_start=0, char_end=1)


# (words, LU word span, frame elements, tokens, each token's word)
SENTENCES = [
    # S0 passes: LU "agitated" (split agit ##ated) <-> core FE "He" 3 words away; the peripheral
    # FE "was becoming" is next to the LU but, not being core, neither filters nor scores.
    (
        "He was becoming agitated".split(),
        (3, 4),
        [fe("Experiencer", 0, 1), fe("Time", 1, 3, "Peripheral", False)],
        ["[CLS]", "he", "was", "becoming", "agit", "##ated", "[SEP]"],
        [None, 0, 1, 2, 3, 3, None],
    ),
    # S1: core FE "cars" is next to the LU "sold": out (min_distance 2); "Kim" alone is 2 away.
    (
        "Yesterday Kim quickly sold cars".split(),
        (3, 4),
        [fe("Seller", 1, 2), fe("Goods", 4, 5, in_core_set=False)],
        ["[CLS]", "yesterday", "kim", "quickly", "sold", "cars", "[SEP]"],
        [None, 0, 1, 2, 3, 4, None],
    ),
    # S2 passes: core FE "The old man" (3 words) ends 2 words before the LU "ate".
    (
        "The old man slowly ate".split(),
        (4, 5),
        [fe("Ingestor", 0, 3, in_core_set=False)],
        ["[CLS]", "the", "old", "man", "slowly", "ate", "[SEP]"],
        [None, 0, 1, 2, 3, 4, None],
    ),
    # S3: a frame element of 5 words: out (max_fe_words 3).
    (
        "The very old grey man ate".split(),
        (5, 6),
        [fe("Ingestor", 0, 5)],
        ["[CLS]", "the", "very", "old", "grey", "man", "ate", "[SEP]"],
        [None, 0, 1, 2, 3, 4, 5, None],
    ),
    # S4: 13 words: out (max_words 12).
    ("a b c d e f g h i j k l m".split(), (12, 13), [fe("X", 0, 1)], ["[CLS]", *"abcdefghijklm", "[SEP]"], [None, *range(13), None]),
    # S5: no core frame element: out.
    (
        "Then she left".split(),
        (2, 3),
        [fe("Time", 0, 1, "Peripheral", False)],
        ["[CLS]", "then", "she", "left", "[SEP]"],
        [None, 0, 1, 2, None],
    ),
]


def head0_map(index: int, n: int) -> np.ndarray:
    """Head 0: every row on [CLS] except the designed LU <-> core FE weights; head 1 stays uniform."""
    a = np.zeros((n, n), dtype=np.float32)
    a[:, 0] = 1
    if index == 0:  # agit -> he 0.7 (the max); ##ated -> becoming 0.9 (peripheral: ignored); he -> ##ated 0.2
        a[4] = 0
        a[4, 1], a[4, 0] = 0.7, 0.3
        a[5] = 0
        a[5, 3], a[5, 0] = 0.9, 0.1
        a[1] = 0
        a[1, 5], a[1, 0] = 0.2, 0.8
    if index == 2:  # FE -> LU: man -> ate 0.4 (the max); LU -> FE: ate -> man 0.3
        a[3] = 0
        a[3, 5], a[3, 0] = 0.4, 0.6
        a[5] = 0
        a[5, 3], a[5, 0] = 0.3, 0.7
    if index == 1:  # uniform in both heads
        a[:] = 1 / n
    if index == 6:  # FE -> LU: she -> slept 0.6; LU -> FE 0
        a[1] = 0
        a[1, 5], a[1, 0] = 0.6, 0.4
    return a


# Two more for the notebook's selection (the default): S6 passes it; S7's target is two words.
NOTEBOOK_SENTENCES = [
    # S6: the only frame element ("She", in the core set) is 4 words from the one-word target "slept".
    (
        "She had never really slept".split(),
        (4, 5),
        [fe("Sleeper", 0, 1)],
        ["[CLS]", "she", "had", "never", "really", "slept", "[SEP]"],
        [None, *range(5), None],
    ),
    # S7: as S6, but the target "worn out" is two words.
    (
        "Kim was very much worn out".split(),
        (4, 6),
        [fe("Patient", 0, 1)],
        ["[CLS]", "kim", "was", "very", "much", "worn", "out", "[SEP]"],
        [None, *range(6), None],
    ),
]


def build_frame_run(store, name="frames", extra=()):
    all_sentences = [*SENTENCES, *extra]
    sentences = [
        (
            words,
            [
                dict(
                    annoset_id=position,
                    frame_id=1,
                    frame="F",
                    lu_id=1,
                    lu="x.v",
                    target_start=lu[0],
                    target_end=lu[1],
                    char_start=0,
                    char_end=1,
                    elements=elements,
                )
            ],
        )
        for position, (words, lu, elements, _, _) in enumerate(all_sentences)
    ]
    dataset_id = frame_dataset(store, name, sentences)
    run = hand_run(store, name, dataset_id=dataset_id, n_layers=1, n_heads=2, dtype="float32", specials=SPECIALS)
    ids = positions_to_ids(store, dataset_id)
    blocks = []
    for position, (_, _, _, tokens, token_words) in enumerate(all_sentences):
        n = len(tokens)
        maps = np.stack([head0_map(position, n), np.full((n, n), 1 / n, dtype=np.float32)])[None]
        blocks.append((ids[position], maps, token_rows(tokens, token_words, SPECIALS)))
    write_blocks(store, run.id, blocks)
    return name


@pytest.fixture
def frame_run(store):
    return build_frame_run(store)


def test_frame_heads_exact_values(store, frame_run):
    df = run_query(store, "frame_heads", run=frame_run, **EARLIER)
    assert list(df.columns) == ["layer", "head", "value", "n_sentences", "top"]
    # S0: max(0.7, 0.2) = 0.7; S2: max(0.4, 0.3) = 0.4; head 1 uniform 1/7 in both (L = 7)
    np.testing.assert_allclose(df.sort_values("head")["value"], [(0.7 + 0.4) / 2, 1 / 7], atol=1e-6)
    assert (df["n_sentences"] == 2).all()
    assert df.sort_values("head")["top"].tolist() == [True, False]
    assert df.attrs["filter_counts"] == dict(
        annotation_sets=6, max_words=5, target=5, max_fe_words=4, has_core=3, min_distance=2, with_tokens=2
    )


def test_the_notebooks_selection_is_the_default(store):
    run = build_frame_run(store, "notebook", extra=NOTEBOOK_SENTENCES)
    df = run_query(store, "frame_heads", run=run).sort_values("head")
    # S0 and S1 have a frame element 1 word from the target (not core in S0: it counts all the same), S2 and S5 no
    # FEcoreSets member, S3 a 5-word FE, S4 13 words, S7 a two-word target: S6 alone, head 0 she -> slept 0.6.
    np.testing.assert_allclose(df["value"], [0.6, 1 / 7], atol=1e-6)
    assert df.attrs["filter_counts"] == dict(
        annotation_sets=8, max_words=7, target=6, max_fe_words=5, has_core=3, min_distance=1, with_tokens=1
    )
    any_target = run_query(store, "frame_heads", run=run, one_word_target=False).sort_values("head")  # S7 joins: 0 in head 0
    np.testing.assert_allclose(any_target["value"], [0.3, (1 / 7 + 1 / 8) / 2], atol=1e-6)
    core_only = run_query(store, "frame_heads", run=run, distance_to="core").sort_values("head")  # S0 joins (He is 3 away)
    np.testing.assert_allclose(core_only["value"], [(0.7 + 0.6) / 2, 1 / 7], atol=1e-6)
    with pytest.raises(InvalidArgumentError, match="distance_to must be 'all'"):
        run_query(store, "frame_heads", run=run, distance_to="near")


def test_frame_heads_top(store, frame_run):
    top = run_query(store, "frame_heads_top", run=frame_run, **EARLIER)
    assert list(top.columns) == ["layer", "head", "value", "n_sentences", "threshold"]
    assert top[["layer", "head"]].values.tolist() == [[0, 0]]
    assert top["threshold"].iloc[0] == pytest.approx(1 / 7 + 0.99 * ((0.7 + 0.4) / 2 - 1 / 7), abs=1e-6)


def test_filter_parameters(store, frame_run):
    earlier = {**EARLIER}
    near = run_query(store, "frame_heads", run=frame_run, **{**earlier, "min_distance": 1})  # S1 now passes (uniform: 1/7)
    np.testing.assert_allclose(near.sort_values("head")["value"], [(0.7 + 1 / 7 + 0.4) / 3, 1 / 7], atol=1e-6)
    # core='set': FEcoreSets members only -- S2's FE is not one (S2 out); S1 keeps only "Kim", 2 words away (S1 in)
    coreset = run_query(store, "frame_heads", run=frame_run, **{**earlier, "core": "set"})
    np.testing.assert_allclose(coreset.sort_values("head")["value"], [(0.7 + 1 / 7) / 2, 1 / 7], atol=1e-6)
    # S3 (a 5-word FE, 1 word from its LU) and S4 (13 words) pass looser filters; head 0 gives them 0
    wide = run_query(
        store, "frame_heads", run=frame_run, **{**earlier, "max_fe_words": 5, "max_words": 13, "min_distance": 1}, examples=[3, 4]
    )
    assert (wide["n_sentences"] == 2).all()
    np.testing.assert_allclose(wide.sort_values("head")["value"], [0.0, (1 / 8 + 1 / 15) / 2], atol=1e-6)
    with pytest.raises(InvalidArgumentError, match="core must be"):
        run_query(store, "frame_heads", run=frame_run, core="Core")


def test_no_sentence_passing_is_an_error_with_the_counts(store, frame_run):
    with pytest.raises(
        InvalidArgumentError, match=r"no FrameNet sentence .* passes the filters .*max_words: 1, target: 1, max_fe_words: 1"
    ):
        run_query(store, "frame_heads", run=frame_run, max_words=3)  # only S5 is short enough, and it has no core FE


def test_run_without_frames_is_refused(store, make_run):
    maps = np.full((1, 2, 3, 3), 1 / 3, dtype=np.float32)
    run = make_run(store, [maps], [["[CLS]", "x", "[SEP]"]], name="noframes")
    with pytest.raises(InvalidArgumentError, match="has no FrameNet frames"):
        run_query(store, "frame_heads", run=run)


def test_span_distance():
    assert span_distance((3, 4), (0, 1)) == 3
    assert span_distance((0, 3), (4, 5)) == 2
    assert span_distance((3, 4), (4, 5)) == 1
    assert span_distance((1, 4), (3, 6)) == 0
