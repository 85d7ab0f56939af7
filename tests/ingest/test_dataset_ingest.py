"""Built-in datasets through the real tokenizer: spans land on the right wordpieces.

The runs are the session's shared real-model runs (`real_runs`, tests/conftest.py): ingested once, on SQLite,
since what these tests check is the alignment of words and pieces, not the database."""

import pytest

pytestmark = pytest.mark.model


def pieces(tokens, start, end):
    return tokens[(tokens["word_position"] >= start) & (tokens["word_position"] < end)]["token"].tolist()


def test_framenet_spans_reach_wordpieces(real_runs):
    store = real_runs("frames")
    run = store.run_info("frames")
    spans = store.sql(
        "SELECT e.position AS example, f.* FROM frame_element_spans f JOIN examples e ON e.id = f.example_id "
        "JOIN runs r ON r.dataset_id = e.dataset_id WHERE r.name = :run",
        {"run": run.name},
    )
    texts = store.examples(run.name).set_index("example")["text_a"]
    for row in spans.itertuples():
        if row.word_start is None:
            continue
        toks = store.tokens(run.name, row.example)
        inside = toks[(toks["word_position"] >= row.word_start) & (toks["word_position"] < row.word_end)]
        assert len(inside) > 0
        text = texts[row.example]
        # every piece's characters lie inside the words of the span
        words = store.words(run.name, row.example).set_index("position")
        lo, hi = words.loc[row.word_start, "char_start"], words.loc[row.word_end - 1, "char_end"]
        assert ((inside["char_start"] >= lo) & (inside["char_end"] <= hi)).all(), (text, row)
    pound = store.examples(run.name)
    example = int(pound[pound["text_a"].str.contains("£200")]["example"].iloc[0])
    toks = store.tokens(run.name, example)
    assert pieces(toks, 2, 3) == ["£2", "##00"]  # non-ASCII symbol glued to a number
    assert toks[toks["word"] == "damage"]["token"].tolist() == ["damage"]
    assert set(toks["upos"].dropna()) and run.manifest["corpus"]["annotator"].startswith("spacy:")


def test_gum_mention_heads_have_wordpieces(real_runs):
    store = real_runs("gum")
    run = store.run_info("gum")
    assert run.n_truncated == 0
    rows = store.sql(
        "SELECT e.position AS example, m.head FROM mentions m JOIN examples e ON e.id = m.example_id "
        "JOIN runs r ON r.dataset_id = e.dataset_id WHERE r.name = :run",
        {"run": run.name},
    )
    assert len(rows) >= 8
    for example, group in rows.groupby("example"):
        toks = store.tokens(run.name, int(example))
        have = set(toks["word_position"].dropna().astype(int))
        assert set(group["head"]) <= have


def test_ud_word_spans_reach_wordpieces(real_runs):
    toks = real_runs("ewt").tokens("ewt", 5)  # "call them at 303-832-8160."
    assert pieces(toks, 3, 4) == ["303", "-", "83", "##2", "-", "81", "##60"]
    assert toks[toks["word"] == "."]["token"].tolist() == ["."]


def test_word_vector_probes_run_on_real_maps(real_runs):
    import numpy as np

    from attnstore.queries.probes import collect, train_and_evaluate

    # probes refuse to evaluate on their training run: a second run of the same sentences (same maps), which warns
    store = real_runs("ewt", "ewt-copy")
    run, copy = store.run_info("ewt"), store.run_info("ewt-copy")
    data = collect(store, run.name)
    uniform_loss = float(np.log(np.diff(np.r_[data.starts, len(data.gold)])).mean())  # loss of the untrained probe
    for kind in ("attn+words", "distance+words"):
        with pytest.warns(UserWarning, match="also among"):
            result = train_and_evaluate(store, run=run.name, eval_run=copy.name, kind=kind, epochs=30)
        assert result["n_eval"] == sum(len(store.words(run.name, e)) for e in range(6))
        assert result["final_loss"] < 0.8 * uniform_loss and result["uas"] > 0.3
