import numpy as np
import pytest

from attnstore.queries import summary
from attnstore.queries.errors import NotFoundError
from attnstore.queries.probes import _group_softmax, attachment_score, collect, sum_by, train_and_evaluate

SENTENCES = [
    (
        ["[CLS]", "the", "dog", "barks", "[SEP]"],
        [dict(form="the", head=1, deprel="det"), dict(form="dog", head=2, deprel="nsubj"), dict(form="barks", head=None, deprel="root")],
    ),
    (
        ["[CLS]", "dog", "barks", "loudly", "[SEP]"],
        [
            dict(form="dog", head=1, deprel="nsubj"),
            dict(form="barks", head=None, deprel="root"),
            dict(form="loudly", head=1, deprel="advmod"),
        ],
    ),
]


def maps_for(words) -> np.ndarray:
    """1 layer, 2 heads: head 0 sends each word to its gold head ([CLS] for the root); head 1 is uniform."""
    n = len(words) + 2
    a = np.zeros((1, 2, n, n), dtype=np.float32)
    a[0, 0, 0, 0] = a[0, 0, n - 1, n - 1] = 1
    for j, w in enumerate(words):
        a[0, 0, j + 1, 0 if w["head"] is None else w["head"] + 1] = 1
    a[0, 1] = 1 / n
    return a


@pytest.fixture
def probe_runs(store, make_run):
    names = []
    for name in ("probe-train", "probe-eval"):
        names.append(
            make_run(store, [maps_for(w) for _, w in SENTENCES], [t for t, _ in SENTENCES], name=name, words_list=[w for _, w in SENTENCES])
        )
    return names


def test_collect_builds_candidate_groups(store, probe_runs):
    data = collect(store, probe_runs[0])
    assert len(data.starts) == 6  # one group per word
    assert np.diff(np.r_[data.starts, len(data.gold)]).tolist() == [3] * 6  # ROOT + the 2 other words
    assert data.gold.reshape(6, 3).sum(1).tolist() == [1] * 6
    assert data.attn.shape[1] == 2 * 2  # 2 heads, both directions
    # the dependent->candidate attention of head 0 is 1 exactly on the gold head
    assert (data.attn[data.gold > 0, 0] == 1).all() and (data.attn[data.gold == 0, 0] == 0).all()


def test_right_branching_baseline_exact(store, probe_runs):
    result = train_and_evaluate(store, run=probe_runs[0], eval_run=probe_runs[1], kind="right-branching")
    assert result["uas"] == pytest.approx(4 / 6)  # all of sentence 1; only "dog -> barks" of sentence 2


def test_attention_probe_learns_the_syntactic_head(store, probe_runs):
    result = train_and_evaluate(store, run=probe_runs[0], eval_run=probe_runs[1], kind="attn", epochs=50)
    assert result["uas"] == 1.0 and result["train_uas"] == 1.0 and result["final_loss"] < 0.5
    store.save_probe_result(probe_runs[0], probe_runs[1], result, params={"epochs": 50})
    saved = store.probe_results()
    assert saved[["run", "eval_run", "kind", "uas"]].values.tolist() == [["probe-train", "probe-eval", "attn", 1.0]]


def test_word_vector_probes_need_model_weights(store, probe_runs):
    with pytest.raises(NotFoundError, match=r"needs model .*not on this machine; pass --model-dir DIR"):
        train_and_evaluate(store, run=probe_runs[0], eval_run=probe_runs[1], kind="attn+words", epochs=1)


def test_helpers():
    values = np.arange(12, dtype=np.float32).reshape(6, 2)
    index = np.array([2, 0, 2, 1, 0, 2])
    expected = np.zeros((4, 2), dtype=np.float32)
    np.add.at(expected, index, values)
    np.testing.assert_array_equal(sum_by(values, index, 4), expected)
    starts = np.array([0, 3])
    prob = _group_softmax(np.array([0.0, 1.0, 2.0, 5.0, 5.0, 0.0]), starts)
    np.testing.assert_allclose(np.add.reduceat(prob, starts), 1.0)
    # ties go to the first candidate of a group
    from attnstore.queries.probes import ProbeData

    data = ProbeData(
        np.zeros((6, 1)),
        np.zeros(6, int),
        np.zeros(6, int),
        np.zeros(6, int),
        np.array([1, 0, 0, 0, 1, 0], dtype=np.float32),
        starts,
        np.zeros(2),
        [],
    )
    assert attachment_score(np.array([1.0, 1.0, 0.0, 3.0, 3.0, 0.0]), data) == 0.5


def test_collect_reads_words_and_tokens_range_by_range(store, probe_runs, monkeypatch):
    whole = collect(store, probe_runs[0])
    monkeypatch.setattr(summary, "SUMMARY_RANGE", 1)  # tables of one example at a time (the run has 2)
    ranged = collect(store, probe_runs[0])
    for field in ("attn", "cand", "dep", "offset", "gold", "starts", "right_branching"):
        np.testing.assert_array_equal(getattr(ranged, field), getattr(whole, field), err_msg=field)
    assert ranged.token_ids == whole.token_ids and len(whole.starts) > 2


# --- training and evaluation on the same sentences (issue 24, item 7) -------------------------------------------

OTHER_SENTENCES = [
    (
        ["[CLS]", "cats", "sleep", "[SEP]"],
        [dict(form="cats", head=1, deprel="nsubj"), dict(form="sleep", head=None, deprel="root")],
    ),
    (
        ["[CLS]", "the", "dog", "barks", "[SEP]"],  # also a training sentence
        [dict(form="the", head=1, deprel="det"), dict(form="dog", head=2, deprel="nsubj"), dict(form="barks", head=None, deprel="root")],
    ),
]


def test_the_same_run_for_training_and_evaluation_is_refused(store, probe_runs):
    from attnstore.store.errors import InvalidArgumentError

    run_id = store.run_info(probe_runs[0]).id
    for eval_run in (probe_runs[0], run_id):  # by name or by id
        with pytest.raises(InvalidArgumentError, match=r"the training run and the evaluation run are both 'probe-train'"):
            train_and_evaluate(store, run=probe_runs[0], eval_run=eval_run, kind="attn", epochs=1)
    # a baseline that trains nothing may be scored on its own run
    assert train_and_evaluate(store, run=probe_runs[0], eval_run=probe_runs[0], kind="right-branching")["uas"] == pytest.approx(4 / 6)


def test_overlapping_sentences_are_counted_in_a_warning(store, probe_runs, make_run):
    import warnings

    from attnstore.queries.probes import ProbeOverlapWarning

    with pytest.warns(ProbeOverlapWarning, match=r"2 of the 2 evaluation sentences of 'probe-eval' are also among the 2 training"):
        train_and_evaluate(store, run=probe_runs[0], eval_run=probe_runs[1], kind="attn", epochs=1)
    maps, tokens, words = [maps_for(w) for _, w in OTHER_SENTENCES], [t for t, _ in OTHER_SENTENCES], [w for _, w in OTHER_SENTENCES]
    other = make_run(store, maps, tokens, name="probe-other", words_list=words)
    with pytest.warns(ProbeOverlapWarning, match=r"^1 of the 2 evaluation sentences of 'probe-other'"):
        train_and_evaluate(store, run=probe_runs[0], eval_run=other, kind="attn", epochs=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ProbeOverlapWarning)  # only the first evaluation sentence, "cats sleep": no overlap
        train_and_evaluate(store, run=probe_runs[0], eval_run=other, kind="attn", epochs=1, max_train=None, max_eval=1)


def test_probe_train_command_refuses_one_run_and_warns_of_overlap(store, probe_runs):
    from click.testing import CliRunner

    from attnstore.api.cli import main

    url = store.locations.db_url if store.engine.dialect.name == "sqlite" else store.engine.url.render_as_string(hide_password=False)
    where = ["--db", url, "--root", store.locations.array_root]
    base = ["probe", "train", "--kind", "attn", "--epochs", "2"]
    same = CliRunner().invoke(main, [*base, "--run", probe_runs[0], "--eval-run", probe_runs[0], *where])
    lines = [line for line in same.output.splitlines() if line.strip()]
    assert same.exit_code == 1 and len(lines) == 1, same.output
    assert lines[0].startswith("Error: the training run and the evaluation run are both 'probe-train'")
    assert store.probe_results().empty
    overlap = CliRunner().invoke(main, [*base, "--run", probe_runs[0], "--eval-run", probe_runs[1], *where])
    assert overlap.exit_code == 0, overlap.output
    warned = [line for line in overlap.stderr.splitlines() if line.startswith("warning:")]
    assert warned == [
        "warning: 2 of the 2 evaluation sentences of 'probe-eval' are also among the 2 training sentences of 'probe-train' "
        "(same text): its UAS is not fully held-out"
    ]
    assert len(store.probe_results()) == 1
