"""K1 attention-pattern classes: the rules on hand-built maps, threshold edges, metrics, split, calibration, queries."""

import numpy as np
import pandas as pd
import pytest
import sqlalchemy as sa
import zarr

from attnstore.queries import patterns as P
from attnstore.queries import run_query
from attnstore.store.errors import InvalidArgumentError
from attnstore.tests.queries import reference

# ---------------------------------------------------------------- hand-built maps

ONE_SEGMENT = 20  # [CLS] w1 .. w18 [SEP]


def one_segment(length=ONE_SEGMENT):
    special = np.zeros(length, bool)
    special[[0, length - 1]] = True
    return special, np.zeros(length, int)


SEGMENT = 20  # words per segment of two-segment inputs: long enough that uniform attention has little on neighbours


def two_segments(a=SEGMENT, b=SEGMENT):
    """[CLS] a words [SEP] b words [SEP]; segment 0 up to the first [SEP], 1 after."""
    length = a + b + 3
    special = np.zeros(length, bool)
    special[[0, a + 1, length - 1]] = True
    segment = np.r_[np.zeros(a + 2, int), np.ones(b + 1, int)]
    return special, segment


def vertical_map(length=ONE_SEGMENT):
    m = np.zeros((length, length))
    m[:, 0] = 0.7  # [CLS]
    m[:, -1] = 0.3  # [SEP]
    return m


def previous_map(length=ONE_SEGMENT):
    m = np.zeros((length, length))
    m[0, 1] = 1
    for i in range(1, length):
        m[i, i - 1] = 1
    return m


def next_map(length=ONE_SEGMENT):
    m = np.zeros((length, length))
    for i in range(length - 1):
        m[i, i + 1] = 1
    m[-1, -2] = 1
    return m


def far_map(length=ONE_SEGMENT, shift=None):
    """Each row on one plain token far from it (no neighbour, no special): no structure the rules see."""
    shift = shift or length // 2
    m = np.zeros((length, length))
    for i in range(length):
        j = 1 + (i - 1 + shift) % (length - 2)
        m[i, j] = 1
    return m


def cross_map(a=SEGMENT, b=SEGMENT):
    """Every plain token attends to the plain token at the same place in the other segment; specials to a far token."""
    special, segment = two_segments(a, b)
    m = np.zeros((len(special), len(special)))
    for i in range(1, a + 1):
        m[i, a + 1 + i] = 1
        m[a + 1 + i, i] = 1
    for i in np.flatnonzero(special):
        m[i, a // 2] = 1
    return m, special, segment


def block_map(a=SEGMENT, b=SEGMENT):
    """Every token attends uniformly to the plain tokens of its own segment."""
    special, segment = two_segments(a, b)
    plain = ~special
    m = np.zeros((len(special), len(special)))
    for i in range(len(special)):
        own = plain & (segment == segment[i])
        m[i, own] = 1 / own.sum()
    return m, special, segment


def test_scores_exact_on_a_tiny_map():
    # [CLS] x y [SEP] z [SEP]: segments 0 0 0 0 1 1
    special = np.array([1, 0, 0, 1, 0, 1], bool)
    segment = np.array([0, 0, 0, 0, 1, 1])
    m = np.array(
        [
            [0.5, 0.5, 0, 0, 0, 0],
            [0.2, 0.2, 0.6, 0, 0, 0],
            [0, 0.5, 0, 0.25, 0.25, 0],
            [1, 0, 0, 0, 0, 0],
            [0, 0.4, 0, 0.2, 0, 0.4],
            [0, 0, 0, 0, 1, 0],
        ]
    )
    s = P.pattern_scores(m, special, segment)
    assert s["vertical"] == pytest.approx((0.5 + 0.2 + 0.25 + 1 + 0.6 + 0) / 6)
    # neighbours: a[0,1] .5, a[1,0] .2, a[1,2] .6, a[2,1] .5, a[2,3] .25, a[3,2] 0, a[3,4] 0, a[4,3] .2, a[4,5] .4, a[5,4] 1
    assert s["diagonal"] == pytest.approx((0.5 + 0.2 + 0.6 + 0.5 + 0.25 + 0.2 + 0.4 + 1) / 6)
    assert s["self"] == pytest.approx((0.5 + 0.2) / 6)
    # plain queries x, y, z: own-segment share of plain mass: x (0.2+0.6)/0.8, y 0.5/0.75, z 0/0.4
    assert s["block"] == pytest.approx((1 + 0.5 / 0.75 + 0) / 3)
    assert np.isnan(P.pattern_scores(m, special, np.zeros(6, int))["block"])  # one segment: no block score


@pytest.mark.parametrize(
    "build, expected",
    [
        (lambda: (vertical_map(), *one_segment()), "vertical"),
        (lambda: (previous_map(), *one_segment()), "diagonal"),
        (lambda: (0.6 * vertical_map() + 0.4 * previous_map(), *one_segment()), "vertical+diagonal"),
        (block_map, "block"),
        (lambda: (far_map(), *one_segment()), "heterogeneous"),
        (cross_map, "heterogeneous"),
        (lambda: (block_map()[0], *one_segment(2 * SEGMENT + 3)), "heterogeneous"),  # the same map read as one segment: no block
    ],
)
def test_each_class_on_a_hand_built_map(build, expected):
    attn, special, segment = build()
    np.testing.assert_allclose(attn.sum(1), 1)
    assert P.classify_map(attn, special, segment) == expected


def test_next_token_is_diagonal_but_self_is_not():
    special, segment = one_segment()
    assert P.classify_map(next_map(), special, segment) == "diagonal"
    assert P.classify_map(np.eye(ONE_SEGMENT), special, segment) == "heterogeneous"


def test_classify_maps_is_classify_map_per_head():
    special, segment = one_segment()
    maps = np.stack([np.stack([vertical_map(), previous_map()]), np.stack([far_map(), 0.6 * vertical_map() + 0.4 * previous_map()])])
    labels = P.classify_maps(maps, special, segment)
    assert labels.shape == (2, 2)
    assert labels.tolist() == [["vertical", "diagonal"], ["heterogeneous", "vertical+diagonal"]]
    for layer in range(2):
        for head in range(2):
            assert labels[layer, head] == P.classify_map(maps[layer, head], special, segment)


def below(x):
    return np.nextafter(x, -np.inf)


def lab(vertical, diagonal, block, thresholds=None, vertical_seg=None, diagonal_seg=None):
    """labels_from_scores of lists of normalised scores (vertical_seg, diagonal_seg NaN unless given)."""
    nan = [np.nan] * len(vertical)
    scores = dict(
        vertical_norm=vertical,
        diagonal_norm=diagonal,
        block_norm=block,
        vertical_seg=nan if vertical_seg is None else vertical_seg,
        diagonal_seg=nan if diagonal_seg is None else diagonal_seg,
    )
    return P.labels_from_scores(scores, thresholds)


def test_threshold_edges():
    t = P.THRESHOLDS
    nan = np.nan
    # vertical: at the threshold it is vertical (margin 1), just below it is not
    assert lab([t["vertical_min"]], [0.0], [nan])[0] == "vertical"
    assert lab([below(t["vertical_min"])], [0.0], [nan])[0] == "heterogeneous"
    # diagonal
    assert lab([0.0], [t["diagonal_min"]], [nan])[0] == "diagonal"
    assert lab([0.0], [below(t["diagonal_min"])], [nan])[0] == "heterogeneous"
    # the mix needs both of its thresholds and wins where its margin (the smaller of its two) is the largest
    mv, md = t["mix_vertical_min"], t["mix_diagonal_min"]
    assert lab([t["vertical_min"]], [t["diagonal_min"]], [nan])[0] == "vertical+diagonal"
    assert lab([below(mv)], [t["diagonal_min"]], [nan])[0] == "diagonal"
    assert lab([t["vertical_min"]], [below(md)], [nan])[0] == "vertical"
    # a dominant score wins over the mix: the margins decide, not a fixed order
    assert lab([mv], [10 * t["diagonal_min"]], [nan])[0] == "diagonal"
    assert lab([10 * t["vertical_min"]], [md], [nan])[0] == "vertical"
    # block: two segments only, at the threshold, and only where no stripe or diagonal holds (local attention stays
    # in its segment too, so a diagonal map's block score is high: it cannot compete on margins)
    assert lab([0.0], [0.0], [t["block_min"]])[0] == "block"
    assert lab([0.0], [0.0], [below(t["block_min"])])[0] == "heterogeneous"
    assert lab([t["vertical_min"]], [0.0], [1.0])[0] == "vertical"
    assert lab([0.0], [t["diagonal_min"]], [1.0])[0] == "diagonal"
    assert lab([0.0], [0.0], [nan])[0] == "heterogeneous"
    # ... unless the segments explain the stripe and the diagonal: then block whatever the margins
    mv, md = t["mix_vertical_min"], t["mix_diagonal_min"]
    assert lab([0.2], [0.3], [t["block_min"]], vertical_seg=[below(mv)], diagonal_seg=[below(md)])[0] == "block"
    assert lab([0.2], [0.3], [t["block_min"]], vertical_seg=[below(mv)], diagonal_seg=[md])[0] != "block"
    assert lab([0.2], [0.3], [below(t["block_min"])], vertical_seg=[0.0], diagonal_seg=[0.0])[0] != "block"


def test_margins_are_the_scores_over_their_thresholds():
    t = dict(vertical_min=0.2, diagonal_min=0.4, mix_vertical_min=0.1, mix_diagonal_min=0.2, block_min=0.5)
    m = P.rule_margins([0.3, 0.05, 0.3], [0.1, 0.8, 0.3], t)
    np.testing.assert_allclose(m[0], [min(3.0, 0.5), 1.5, 0.25])
    np.testing.assert_allclose(m[1], [min(0.5, 4.0), 0.25, 2.0])
    np.testing.assert_allclose(m[2], [1.5, 1.5, 0.75])  # a tie goes to the earlier class: the mix
    assert lab([0.3, 0.05, 0.3], [0.1, 0.8, 0.3], [np.nan, 0.25, np.nan], t).tolist() == [
        "vertical",
        "diagonal",
        "vertical+diagonal",
    ]
    with pytest.raises(InvalidArgumentError, match="positive"):
        P.rule_margins([0.1], [0.1], dict(vertical_min=0.0))


# ---------------------------------------------------------------- the rules at every length (issue 26 K1)

LENGTHS = (6, 8, 10, 12, 32, 64, 128)


def uniform_map(length):
    return np.full((length, length), 1.0 / length)


def cls_map(length, column=0):
    m = np.zeros((length, length))
    m[:, column] = 1
    return m


def two_segments_of(length):
    """[CLS] a.. [SEP] b.. [SEP] of `length` tokens (a gets the odd one)."""
    a = (length - 2) // 2
    return two_segments(a, length - 3 - a)


@pytest.mark.parametrize("length", LENGTHS)
def test_uniform_maps_score_zero_and_are_heterogeneous_at_every_length(length):
    for special, segment in (one_segment(length), two_segments_of(length)):
        s = P.pattern_scores(uniform_map(length), special, segment)
        for key in ("vertical_norm", "diagonal_norm"):
            assert s[key] == pytest.approx(0.0, abs=1e-12)
        assert np.isnan(s["block_norm"]) if np.isnan(s["block"]) else s["block_norm"] == pytest.approx(0.0, abs=1e-12)
        assert P.classify_map(uniform_map(length), special, segment) == "heterogeneous"


@pytest.mark.parametrize("length", LENGTHS)
def test_pure_patterns_score_one_and_get_their_class_at_every_length(length):
    special, segment = one_segment(length)
    cases = {
        "diagonal": previous_map(length),
        "vertical": cls_map(length),
        "vertical+diagonal": 0.6 * cls_map(length) + 0.4 * previous_map(length),
    }
    for expected, attn in cases.items():
        np.testing.assert_allclose(attn.sum(1), 1)
        assert P.classify_map(attn, special, segment) == expected, (length, expected)
    assert P.pattern_scores(previous_map(length), special, segment)["diagonal_norm"] == pytest.approx(1.0)
    assert P.pattern_scores(cls_map(length), special, segment)["vertical_norm"] == pytest.approx(1.0)
    assert P.classify_map(next_map(length), special, segment) == "diagonal"
    attn, two_special, two_segment = block_map((length - 2) // 2, length - 3 - (length - 2) // 2)
    assert P.pattern_scores(attn, two_special, two_segment)["block_norm"] == pytest.approx(1.0)
    assert P.classify_map(attn, two_special, two_segment) == "block"


@pytest.mark.parametrize("length", LENGTHS)
def test_the_cases_the_fixed_order_got_wrong(length):
    special, segment = one_segment(length)
    # a clearly diagonal map with a [CLS] share of 0.25 or more: diagonal, not vertical+diagonal
    assert P.classify_map(0.25 * cls_map(length) + 0.75 * previous_map(length), special, segment) == "diagonal"
    # a stripe on an ordinary token: vertical
    assert P.classify_map(cls_map(length, column=length // 2), special, segment) == "vertical"
    # a modest [CLS] share over diffuse attention, far above what a uniform map gives it: vertical
    assert P.classify_map(0.3 * cls_map(length) + 0.7 * uniform_map(length), special, segment) == "vertical"
    # ... and a faint one, within noise of uniform, is not
    assert P.classify_map(0.05 * cls_map(length) + 0.95 * uniform_map(length), special, segment) == "heterogeneous"


def test_thresholds_can_be_overridden_and_are_checked():
    special, segment = one_segment()
    assert P.classify_map(vertical_map(), special, segment, thresholds=dict(vertical_min=1.01, mix_vertical_min=1.01)) == "heterogeneous"
    with pytest.raises(InvalidArgumentError, match="unknown thresholds"):
        lab([0.1], [0.1], [np.nan], dict(vertical=0.5))


def test_bad_shapes_raise():
    special, segment = one_segment()
    with pytest.raises(InvalidArgumentError):
        P.classify_map(np.zeros((3, 4)), special[:3], segment[:3])
    with pytest.raises(InvalidArgumentError):
        P.classify_map(vertical_map(), special[:5], segment)
    with pytest.raises(InvalidArgumentError):
        P.classify_map(np.zeros((2, 2, 20, 20)), special, segment)


# ---------------------------------------------------------------- metrics, split, calibration


def test_metrics_exact_on_a_hand_confusion_matrix():
    true = ["vertical"] * 5 + ["diagonal"] * 3 + ["block"] * 2
    pred = ["vertical"] * 4 + ["diagonal"] + ["diagonal"] * 2 + ["heterogeneous"] + ["vertical"] * 2
    result = P.evaluate(true, pred)
    expected = np.zeros((5, 5), int)
    expected[0, 0], expected[0, 1], expected[1, 1], expected[1, 4], expected[3, 0] = 4, 1, 2, 1, 2
    np.testing.assert_array_equal(result["confusion"], expected)
    # vertical: P 4/6, R 4/5 -> F1 8/11; diagonal: P 2/3, R 2/3 -> 2/3; block: 0; heterogeneous: P 0 -> 0
    np.testing.assert_allclose(result["precision"], [4 / 6, 2 / 3, 0, 0, 0])
    np.testing.assert_allclose(result["recall"], [4 / 5, 2 / 3, 0, 0, 0])
    np.testing.assert_allclose(result["f1"], [8 / 11, 2 / 3, 0, 0, 0])
    np.testing.assert_array_equal(result["support"], [5, 3, 0, 2, 0])
    # macro over the classes true or predicted (vertical, diagonal, block, heterogeneous): the mix is left out
    assert result["macro_f1"] == pytest.approx((8 / 11 + 2 / 3 + 0 + 0) / 4)
    assert result["weighted_f1"] == pytest.approx((5 * 8 / 11 + 3 * 2 / 3) / 10)
    assert result["accuracy"] == pytest.approx(6 / 10)
    with pytest.raises(InvalidArgumentError, match="unknown class"):
        P.confusion_matrix(["vertical"], ["stripes"])


def test_fast_macro_f1_agrees_with_the_plain_one():
    rng = np.random.default_rng(3)
    true = rng.integers(0, 5, 60)
    preds = rng.integers(0, 5, (7, 60))
    fast = P._macro_f1_rows(true, preds, 5)
    for row, value in zip(preds, fast):
        assert value == pytest.approx(P.evaluate([P.CLASSES[i] for i in true], [P.CLASSES[i] for i in row])["macro_f1"])


def test_stratified_split_is_seeded_and_keeps_every_class_on_both_sides():
    labels = ["vertical"] * 40 + ["diagonal"] * 8 + ["block"] * 2 + ["heterogeneous"] * 30
    a = P.stratified_split(labels, 0.25, seed=1)
    assert (a == P.stratified_split(labels, 0.25, seed=1)).all()
    assert not (a == P.stratified_split(labels, 0.25, seed=2)).all()
    labels = np.array(labels)
    assert [int(a[labels == c].sum()) for c in ("vertical", "diagonal", "block", "heterogeneous")] == [10, 2, 1, 8]
    with pytest.raises(InvalidArgumentError):
        P.stratified_split(labels, 1.0)


def test_calibrate_recovers_separating_thresholds():
    rng = np.random.default_rng(0)
    rows, labels = [], []
    for _ in range(20):
        rows.append((rng.uniform(0.72, 0.95), rng.uniform(0.0, 0.1), np.nan, np.nan, np.nan))
        labels.append("vertical")
        rows.append((rng.uniform(0.0, 0.1), rng.uniform(0.62, 0.9), np.nan, np.nan, np.nan))
        labels.append("diagonal")
        rows.append((rng.uniform(0.0, 0.2), rng.uniform(0.0, 0.2), rng.uniform(0.0, 0.4), 0.0, 0.0))
        labels.append("heterogeneous")
        rows.append((rng.uniform(0.0, 0.2), rng.uniform(0.0, 0.2), rng.uniform(0.83, 1.0), 0.0, 0.0))
        labels.append("block")
        rows.append((rng.uniform(0.42, 0.55), rng.uniform(0.33, 0.45), np.nan, np.nan, np.nan))
        labels.append("vertical+diagonal")
    scores = pd.DataFrame(rows, columns=list(P.NORMALISED))
    best, f1 = P.calibrate(scores, labels, grid=np.round(np.arange(0.1, 0.91, 0.1), 2))
    assert f1 == pytest.approx(1.0)
    predicted = P.labels_from_scores(scores, best)
    assert list(predicted) == labels


# ---------------------------------------------------------------- queries over a stored run


TOKENS_ONE = ["[CLS]", *[f"w{i}" for i in range(18)], "[SEP]"]
TOKENS_TWO = ["[CLS]", *[f"a{i}" for i in range(SEGMENT)], "[SEP]", *[f"b{i}" for i in range(SEGMENT)], "[SEP]"]


@pytest.fixture
def pattern_run(store, make_run):
    """Two examples, 1 layer x 3 heads. Example 0 (one segment): vertical, diagonal, heterogeneous.
    Example 1 (two segments): block, vertical+diagonal, vertical."""
    m0 = np.stack([vertical_map(), previous_map(), far_map()])[None]
    length = len(TOKENS_TWO)
    vd = np.zeros((length, length))
    vd[:, 0] = 0.5
    vd[0, 0] = 1
    for i in range(1, length):
        vd[i, i - 1] += 0.5
    vert = np.zeros((length, length))
    vert[:, SEGMENT + 1] = 1  # the middle [SEP]
    m1 = np.stack([block_map()[0], vd, vert])[None]
    run = make_run(store, [m0.astype(np.float32), m1.astype(np.float32)], [TOKENS_ONE, TOKENS_TWO], name="patterns")
    with store.engine.begin() as conn:  # make_run writes one segment: the second example's tail is segment 1
        conn.execute(
            sa.text("UPDATE tokens SET segment = 1 WHERE position >= :first AND example_id = (SELECT max(example_id) FROM tokens)"),
            {"first": SEGMENT + 2},
        )
    return run


def test_pattern_classes_query_and_save(store, pattern_run):
    frame = run_query(store, "pattern_classes", run=pattern_run)
    assert list(frame.columns) == ["example", "layer", "head", "label", *P.SCORES]
    assert frame["label"].tolist() == ["vertical", "diagonal", "heterogeneous", "block", "vertical+diagonal", "vertical"]
    assert frame["block"].isna().tolist() == [True] * 3 + [False] * 3
    assert store.pattern_labels(pattern_run).empty
    run_query(store, "pattern_classes", run=pattern_run, save=True)
    saved = store.pattern_labels(pattern_run, source="rules")
    assert saved["label"].tolist() == frame["label"].tolist()
    assert set(saved["source"]) == {"rules"} and saved["source_row"].tolist() == [0, 0, 0, 1, 1, 1]
    run_query(store, "pattern_classes", run=pattern_run, save=True)  # saving again relabels, never duplicates
    assert len(store.pattern_labels(pattern_run)) == 6
    one = run_query(store, "pattern_classes", run=pattern_run, max_examples=1, seed=0)
    assert one["example"].nunique() == 1


def test_pattern_proportions_and_heads(store, pattern_run):
    shares = run_query(store, "pattern_proportions", run=pattern_run)
    assert shares["label"].tolist() == list(P.CLASSES)
    np.testing.assert_allclose(shares["fraction"], [2 / 6, 1 / 6, 1 / 6, 1 / 6, 1 / 6])
    assert shares["n_maps"].sum() == 6 and set(shares["n_examples"]) == {2}
    heads = run_query(store, "pattern_heads", run=pattern_run)
    assert heads["majority"].tolist() == ["vertical", "diagonal", "vertical"]  # ties go to the earlier class
    np.testing.assert_allclose(heads["vertical"], [0.5, 0, 0.5])
    assert heads["n_maps"].tolist() == [2, 2, 2]
    with pytest.raises(InvalidArgumentError, match="no pattern labels from source 'cnn'"):
        run_query(store, "pattern_proportions", run=pattern_run, source="cnn")
    store.save_pattern_labels(pd.DataFrame(dict(run=pattern_run, example=[0, 1], layer=0, head=0, label="block")), source="cnn")
    from_cnn = run_query(store, "pattern_proportions", run=pattern_run, source="cnn")
    assert from_cnn.set_index("label")["n_maps"].to_dict()["block"] == 2


def test_save_pattern_labels_checks_every_row_first(store, pattern_run):
    good = dict(run=pattern_run, example=0, layer=0, head=0, label="vertical")
    for bad, message in [(dict(example=7), "no stored example 7"), (dict(head=3), "out of range"), (dict(run="nope"), "no run 'nope'")]:
        with pytest.raises(Exception, match=message):
            store.save_pattern_labels(pd.DataFrame([good, dict(good, **bad)]), source="human")
        assert store.pattern_labels().empty


@pytest.mark.parametrize("params", [{}, {"examples": [1]}, {"max_examples": 1, "seed": 3}])
def test_kept_rule_scores_give_the_naive_frame(store, pattern_run, monkeypatch, params):
    kept_frame = run_query(store, "pattern_classes", run=pattern_run, **params)
    assert "pattern_scores" in zarr.open_group(store.locations.array_root, path="runs/patterns/summary", mode="r")
    with monkeypatch.context() as m:  # the kept path decodes no map
        m.setattr(type(store), "iter_attention", lambda *a, **k: (_ for _ in ()).throw(AssertionError("read maps")))
        again = run_query(store, "pattern_classes", run=pattern_run, **params)
        heads = run_query(store, "pattern_heads", run=pattern_run, **params)
    naive = reference.query(store, "pattern_classes", run=pattern_run, **params)
    pd.testing.assert_frame_equal(kept_frame, naive)
    pd.testing.assert_frame_equal(again, naive)
    pd.testing.assert_frame_equal(heads, reference.query(store, "pattern_heads", run=pattern_run, **params))


def test_whole_run_proportions_and_heads_add_kept_range_counts(store, pattern_run, monkeypatch):
    """Over a whole run (no more examples than max_examples) the two queries add the rule labels counted per range (one
    example per range here); equal to counting pattern_classes' labels, and no example's scores read once kept. A sample
    (max_examples below the run's size) counts that sample's labels."""
    from attnstore.queries import engine as summary

    monkeypatch.setattr("attnstore.queries.engine.kinds.SUMMARY_RANGE", 1)
    first = [run_query(store, name, run=pattern_run) for name in ("pattern_proportions", "pattern_heads")]
    kept = summary.kept_ranges(store, store.run_info(pattern_run), P.PATTERN_SCORES)
    assert kept is not None and kept.n == 2
    assert kept.block(0, 2)["label_counts"].sum((1, 2)).tolist() == [[1, 1, 0, 0, 1], [1, 0, 1, 1, 0]]  # CLASSES' order
    pd.testing.assert_frame_equal(first[1], reference.query(store, "pattern_heads", run=pattern_run))

    def refuse(*args, **kwargs):
        raise AssertionError("a whole-run query read per-example fields although ranges are kept")

    with monkeypatch.context() as m:
        m.setattr("attnstore.queries.engine.kept._summary_parts", refuse)
        for name, want in zip(("pattern_proportions", "pattern_heads"), first):
            pd.testing.assert_frame_equal(run_query(store, name, run=pattern_run, max_examples=None), want)
    from attnstore.queries.engine import get_query
    from attnstore.queries.engine.registry import coerce_params

    for name in ("pattern_classes", "pattern_proportions", "pattern_heads"):  # --param max_examples=none: every example
        assert coerce_params(get_query(name), {"max_examples": "none"}) == {"max_examples": None}
    with monkeypatch.context() as m:  # kept scores: a sample is drawn from their example column, not from SQL
        m.setattr(type(store), "storage_order", refuse)
        sample = run_query(store, "pattern_classes", run=pattern_run, max_examples=1, seed=3)
        shares = run_query(store, "pattern_proportions", run=pattern_run, max_examples=1, seed=3)
        with pytest.raises(InvalidArgumentError, match=r"no stored example\(s\) \[7\]"):
            run_query(store, "pattern_heads", run=pattern_run, examples=[1, 7])
    counted = sample["label"].value_counts().reindex(list(P.CLASSES), fill_value=0)
    assert shares["n_maps"].tolist() == counted.tolist() and set(shares["n_examples"]) == {1}
    for name in ("pattern_proportions", "pattern_heads"):  # a count below 1 is refused, not read as "the whole run"
        with pytest.raises(InvalidArgumentError, match="max_examples must be at least 1, not 0"):
            run_query(store, name, run=pattern_run, max_examples=0)


def test_a_samples_label_counts_read_only_the_normalised_scores(store, pattern_run, monkeypatch):
    """`pattern_scores` declares the fields its totals read (totals_fields): a sample's counts read those five and the
    example column from the kept scores, not the raw ones, and count what the whole scores count."""
    from attnstore.queries import engine as summary
    from attnstore.store.summaries import SummaryParts

    run_query(store, "pattern_classes", run=pattern_run)  # keeps the scores
    info = store.run_info(pattern_run)
    whole = summary.summary(store, info, P.PATTERN_SCORES)
    only = {k: whole[k] for k in ("example", *P.PATTERN_SCORES.totals_fields)}
    for name, counts in P.PATTERN_SCORES.totals(whole).items():
        np.testing.assert_array_equal(P.PATTERN_SCORES.totals(only)[name], counts)
    read, rows = [], SummaryParts.rows

    def noting(self, positions, fields=None, *args, **kwargs):
        read.append(fields)
        return rows(self, positions, fields, *args, **kwargs)

    monkeypatch.setattr(SummaryParts, "rows", noting)
    shares = run_query(store, "pattern_proportions", run=pattern_run, max_examples=1, seed=3)
    assert read == [P.NORMALISED]
    sample = run_query(store, "pattern_classes", run=pattern_run, max_examples=1, seed=3)
    assert read[1] is None  # pattern_classes gives every score
    counted = sample["label"].value_counts().reindex(list(P.CLASSES), fill_value=0)
    assert shares["n_maps"].tolist() == counted.tolist()


def test_the_sampled_bench_refuses_bad_input_in_one_line(tmp_path, monkeypatch):
    """benchmarks/sampled_summaries.py: a sample size below 1 is a usage error; a run the store lacks is one line naming
    it and the runs it has (from the child process), not a traceback."""
    from attnstore.store import migrate
    from attnstore.tests.queries.test_registry import _script

    bench = _script("benchmarks/sampled_summaries.py")
    home = tmp_path / "home"
    home.mkdir()
    migrate.upgrade(f"sqlite:///{home / 'meta.sqlite'}")  # an empty store: no runs
    monkeypatch.setattr("sys.argv", ["sampled_summaries.py", "--home", str(home), "--run", "MRPC-dev", "--samples", "0"])
    with pytest.raises(SystemExit) as usage:
        bench.main()
    assert usage.value.code == 2
    monkeypatch.setattr("sys.argv", ["sampled_summaries.py", "--home", str(home), "--run", "nope", "--repeats", "1"])
    with pytest.raises(SystemExit) as missing:
        bench.main()
    message = str(missing.value.code)
    assert message.startswith("pattern_proportions max_examples=none failed: no run 'nope'") and "\n" not in message
