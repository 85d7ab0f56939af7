import numpy as np
import pytest

from attnstore.queries.errors import NotFoundError
from attnstore.queries.probes import _group_log_softmax, attachment_score, collect, train_and_evaluate

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
    import torch

    starts = np.array([0, 3])
    scores = torch.tensor([0.0, 1.0, 2.0, 5.0, 5.0, 1000.0], dtype=torch.float64)
    log_prob = _group_log_softmax(scores, torch.tensor([0, 0, 0, 1, 1, 1]), 2)
    np.testing.assert_allclose(np.add.reduceat(log_prob.exp().numpy(), starts), 1.0)
    for group in (slice(0, 3), slice(3, 6)):  # each group's torch.log_softmax (stable for large scores too)
        np.testing.assert_allclose(log_prob[group].numpy(), torch.log_softmax(scores[group], 0).numpy())
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
    monkeypatch.setattr("attnstore.queries.engine.kinds.SUMMARY_RANGE", 1)  # tables of one example at a time (the run has 2)
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


# --- training with torch.optim.Adam and autograd (issue 25) ---------------------------------------------------


def small_problem(seed=0, n_groups=7, n_features=4, dim=3, n_words=9):
    """A hand-built probe problem: groups of 2-5 candidates, one gold each, random attention and word vectors."""
    from attnstore.queries.probes import MAX_OFFSET, ProbeData

    rng = np.random.default_rng(seed)
    counts = rng.integers(2, 6, n_groups)
    n = int(counts.sum())
    gold = np.zeros(n, dtype=np.float32)
    starts = np.r_[0, np.cumsum(counts)[:-1]]
    gold[starts + rng.integers(0, counts)] = 1
    data = ProbeData(
        attn=rng.random((n, n_features)).astype(np.float32),
        cand=rng.integers(0, n_words, n),
        dep=np.repeat(rng.integers(0, n_words, n_groups), counts),
        offset=rng.integers(0, 2 * MAX_OFFSET + 2, n),
        gold=gold,
        starts=starts,
        right_branching=np.zeros(n_groups),
        token_ids=[],
    )
    return data, rng.standard_normal((n_words, dim)).astype(np.float32)


def reference_losses(kind, init, data, vectors, epochs, lr):
    """A naive reference: each pair's score written from the probe's formula, one group at a time, with torch.optim.Adam."""
    import torch

    params = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in init.items()}
    attn, vec = torch.tensor(data.attn, dtype=torch.float64), torch.tensor(vectors, dtype=torch.float64)
    dim = vec.shape[1]
    optimiser = torch.optim.Adam(params.values(), lr=lr, betas=(0.9, 0.999), eps=1e-8)
    ends = np.r_[data.starts[1:], len(data.gold)]
    losses = []
    for _ in range(epochs):
        optimiser.zero_grad()
        loss = torch.zeros((), dtype=torch.float64)
        for start, end in zip(data.starts, ends):
            scores = []
            for p in range(start, end):
                c, d = data.cand[p], data.dep[p]
                if kind == "attn":
                    scores.append(attn[p] @ params["w"])
                elif kind == "attn+words":
                    scores.append(
                        sum(
                            attn[p, k] * (vec[c] @ params["top"][:, k] + vec[d] @ params["bottom"][:, k] + params["w"][k])
                            for k in range(attn.shape[1])
                        )
                    )
                else:
                    scores.append(vec[c] @ params["v"][:dim] + vec[d] @ params["v"][dim:] + params["b"][data.offset[p]])
            loss = loss - torch.log_softmax(torch.stack(scores), 0)[int(np.flatnonzero(data.gold[start:end])[0])]
        loss = loss / len(data.starts)
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    return losses, {k: v.detach().numpy() for k, v in params.items()}


@pytest.mark.parametrize("kind", ["attn", "attn+words", "distance+words"])
def test_probe_training_matches_a_naive_torch_reference(kind):
    from attnstore.queries.probes import Probe

    data, vectors = small_problem()
    probe = Probe(kind, data.attn.shape[1], vectors.shape[1], seed=3)
    init = {k: v.copy() for k, v in probe.params.items()}
    losses = probe.fit(data, vectors, epochs=40, lr=0.05)
    expected, weights = reference_losses(kind, init, data, vectors, epochs=40, lr=0.05)
    assert losses[-1] < 0.8 * losses[0]  # it learns
    np.testing.assert_allclose(losses, expected, atol=1e-6, rtol=0)  # float32 probe against a float64 reference
    if kind == "distance+words":
        # the dependent's half of v adds one constant to a whole group: its gradient is zero but for rounding, which
        # Adam's normalised steps blow up in float32 (in float64 too, only smaller); it changes no probability
        weights["v"], probe.params["v"] = weights["v"][: vectors.shape[1]], probe.params["v"][: vectors.shape[1]]
    for k, v in weights.items():
        np.testing.assert_allclose(probe.params[k], v, atol=1e-5, rtol=0, err_msg=k)


def test_probe_adam_is_the_hand_written_adam_it_replaced():
    """The `attn` probe against Adam's moments written out in float64 (betas 0.9/0.999, eps 1e-8, no weight decay)
    with the softmax log-likelihood's gradient derived by hand, as the probe was trained before torch.optim."""
    from attnstore.queries.probes import Probe

    data, _ = small_problem(seed=1)
    epochs, lr = 60, 0.05
    probe = Probe("attn", data.attn.shape[1], 0)
    losses = probe.fit(data, epochs=epochs, lr=lr)
    x, n = data.attn.astype(np.float64), len(data.starts)
    counts = np.diff(np.r_[data.starts, len(data.gold)])
    w, m, v = np.zeros(x.shape[1]), np.zeros(x.shape[1]), np.zeros(x.shape[1])
    expected = []
    for step in range(1, epochs + 1):
        s = x @ w
        e = np.exp(s - np.repeat(np.maximum.reduceat(s, data.starts), counts))
        prob = e / np.repeat(np.add.reduceat(e, data.starts), counts)
        expected.append(-np.log(prob[data.gold > 0]).sum() / n)
        grad = x.T @ (prob - data.gold) / n
        m = 0.9 * m + 0.1 * grad
        v = 0.999 * v + 0.001 * grad**2
        w -= lr * (m / (1 - 0.9**step)) / (np.sqrt(v / (1 - 0.999**step)) + 1e-8)
    np.testing.assert_allclose(losses, expected, atol=1e-6, rtol=0)
    np.testing.assert_allclose(probe.params["w"], w, atol=1e-5, rtol=0)
