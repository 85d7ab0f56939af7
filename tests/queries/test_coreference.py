import numpy as np
import pandas as pd
import pytest

from attnstore.queries import engine as summary
from attnstore.queries import run_query
from attnstore.queries.coreference import MENTION_ARGMAX, choose_antecedent, coreference_counts
from attnstore.queries.engine import asked
from attnstore.tests.queries import helpers, reference

TOKENS = ["[CLS]", "anna", "met", "bob", "she", "smiled", "[SEP]"]
WORDS = [
    dict(form="Anna", upos="PROPN", feats="Number=Sing"),
    dict(form="met", upos="VERB"),
    dict(form="Bob", upos="PROPN", feats="Gender=Masc|Number=Sing"),
    dict(form="she", upos="PRON", feats="Gender=Fem|Number=Sing|Person=3"),
    dict(form="smiled", upos="VERB"),
]
MENTIONS = [
    dict(word_start=0, word_end=1, head=0, entity="A", kind="proper", doc_order=0),
    dict(word_start=2, word_end=3, head=2, entity="B", kind="proper", doc_order=1),
    dict(word_start=3, word_end=4, head=3, entity="A", kind="pronoun", doc_order=2),
]


def hand_maps():
    """1 layer, 2 heads: everything attends to [CLS], except "she" -> "anna" (head 0) / -> "bob" (head 1)."""
    a = np.zeros((1, 2, 7, 7), dtype=np.float32)
    a[..., 0] = 1
    a[0, 0, 4] = 0
    a[0, 0, 4, 1] = 1
    a[0, 1, 4] = 0
    a[0, 1, 4, 3] = 1
    return a


@pytest.fixture
def coref_run(store, make_run):
    return make_run(
        store,
        [hand_maps()],
        [TOKENS],
        name="coref",
        token_words=[[None, 0, 1, 2, 3, 4, None]],
        words_list=[WORDS],
        mentions_list=[MENTIONS],
    )


def test_coreference_per_head_exact(store, coref_run):
    df = run_query(store, "coreference", run=coref_run).sort_values("head")
    assert df["all"].tolist() == [1.0, 0.0] and df["pronoun"].tolist() == [1.0, 0.0]
    assert df["proper"].isna().all() and df["nominal"].isna().all()  # no proper/nominal mention has an antecedent


def test_coreference_summary_and_baselines(store, coref_run):
    df = run_query(store, "coreference_summary", run=coref_run).set_index("method")
    assert df.loc["head 0-0", "all"] == 1.0
    assert df.loc["nearest", "pronoun"] == 0.0  # Bob is nearer
    assert df.loc["head_match", "pronoun"] == 0.0  # no earlier "she": no pick
    assert df.loc["sieve", "pronoun"] == 1.0  # gender agreement rules Bob out
    # one row per method, layer and head integers (blank for the baselines), the mention counts beside the rows
    assert list(df.index) == ["head 0-0", "nearest", "head_match", "sieve"]
    assert str(df["layer"].dtype) == "Int64" and str(df["head"].dtype) == "Int64" and df["layer"].isna().sum() == 3
    assert df.attrs["n_mentions"] == {"all": 1, "pronoun": 1, "proper": 0, "nominal": 0}


def test_a_tie_or_a_row_of_zeros_predicts_nothing(store, make_run):
    """The rule `dependency` follows: "she" spreading its attention evenly over "anna" and "bob" (head 0), or giving
    the words nothing (head 1: everything on [CLS]), names no antecedent, so the mention counts as missed; the
    authors' np.argmax would have named the first word, "anna", and counted both right."""
    maps = np.zeros((1, 2, 7, 7), dtype=np.float32)
    maps[..., 0] = 1
    maps[0, 0, 4] = 0
    maps[0, 0, 4, 1] = maps[0, 0, 4, 3] = 0.5
    run = make_run(
        store, [maps], [TOKENS], name="coref-ties", token_words=[[None, 0, 1, 2, 3, 4, None]], words_list=[WORDS], mentions_list=[MENTIONS]
    )
    for frame in (run_query(store, "coreference", run=run), reference.query(store, "coreference", run=run)):
        assert frame.sort_values("head")["all"].tolist() == [0.0, 0.0]
    kept = helpers.summary_group(store, run, "mention_argmax")
    assert kept["word"][:].tolist() == [0, 2, 3] and (kept["attended"][:][2] == -1).all()  # "she": no prediction


def test_sieve_order():
    m = dict(text="the cat", head_form="cat", feats={"Number": "Sing"})
    exact = dict(text="the cat", head_form="cat", feats={}, entity=1)
    head = dict(text="a cat", head_form="cat", feats={}, entity=2)
    agree = dict(text="it", head_form="it", feats={"Number": "Sing"}, entity=3)
    plural = dict(text="they", head_form="they", feats={"Number": "Plur"}, entity=4)
    assert choose_antecedent(m, [exact, head, agree, plural], "sieve") is exact
    assert choose_antecedent(m, [head, agree, plural], "sieve") is head
    assert choose_antecedent(m, [agree, plural], "sieve") is agree
    assert choose_antecedent(m, [plural], "sieve") is plural
    assert choose_antecedent(m, [], "nearest") is None


# --- predictions kept with the run (queries/engine/): the naive reference's counts, exactly ---------------------

FORMS = ("anna", "bob", "she", "he", "it", "the", "cat", "saw")
FEATS = ("Number=Sing", "Gender=Fem|Number=Sing", "Gender=Masc|Number=Sing|Person=3", "Number=Plur", None)


def kept_example(seed: int):
    """Random words (1-2 pieces each; the last one cut, without a piece, in every third example) and mentions of
    three entities (none in every fourth example); float16 maps with rows of exact zeros among the words and
    ties. Returns (maps (2, 3, L, L), tokens, token_words, words, mentions)."""
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(6, 12))
    words = [dict(form=str(rng.choice(FORMS)), upos="X", feats=FEATS[int(rng.integers(len(FEATS)))]) for _ in range(n)]
    mentions = []
    for i in range(0 if seed % 4 == 3 else int(rng.integers(3, 7))):
        start = int(rng.integers(n))
        end = min(n, start + int(rng.integers(1, 3)))
        mentions.append(
            dict(
                word_start=start,
                word_end=end,
                head=int(rng.integers(start, end)),
                entity=str(rng.choice(["A", "B", "C"])),
                kind=str(rng.choice(["pronoun", "proper", "nominal"])),
                doc_order=i,
            )
        )
    covered = n - 1 if seed % 3 == 2 else n
    tokens, token_words = ["[CLS]"], [None]
    for i in range(covered):
        pieces = int(rng.integers(1, 3))
        tokens += [words[i]["form"], *["##x"] * (pieces - 1)]
        token_words += [i] * pieces
    tokens.append("[SEP]")
    token_words.append(None)
    maps = helpers.sparse_random_maps(rng, len(tokens))  # a row with everything on [CLS]: argmax picks the first other word
    return maps, tokens, token_words, words, mentions


@pytest.fixture
def kept_run(store, make_run):
    maps, tokens, token_words, words, mentions = (list(x) for x in zip(*(kept_example(seed) for seed in range(8))))
    return make_run(
        store, maps, tokens, name="keptcoref", token_words=token_words, words_list=words, mentions_list=mentions, dtype="float16"
    )


def assert_same(a, b):
    assert a[0].id == b[0].id
    for x, y in zip(a[1:], b[1:]):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("range_size", [4096, 3])  # 3: kept and read in ranges of 3 examples
def test_kept_predictions_give_the_naive_counts_exactly(store, kept_run, monkeypatch, range_size):
    monkeypatch.setattr("attnstore.queries.engine.kinds.SUMMARY_RANGE", range_size)
    with helpers.read_only_store(store) as reader:  # a read-only store computes for the call alone and keeps nothing
        with asked(reader, kept_run, [1, 2, 6]):
            read_only = coreference_counts(reader, kept_run)
    assert not helpers.has_summaries(store, kept_run)
    with asked(store, kept_run, [1, 2, 6]):
        assert_same(read_only, coreference_counts(store, kept_run))
    for examples in (None, [6, 0, 3, 5]):
        with asked(store, kept_run, examples):
            counts = coreference_counts(store, kept_run)
            heads_only = coreference_counts(store, kept_run, baselines=False)
        assert_same(counts, reference.coreference_counts(store, kept_run, examples=examples))
        np.testing.assert_array_equal(heads_only[1], counts[1])
        np.testing.assert_array_equal(heads_only[3], counts[3])
    assert counts[3].sum() > 0 and 0 < counts[1].sum() < counts[3].sum() * 6
    for name in ("coreference", "coreference_summary"):
        pd.testing.assert_frame_equal(
            run_query(store, name, run=kept_run),
            reference.query(store, name, run=kept_run),
            check_exact=True,
        )


def test_predictions_are_kept_with_the_run_read_without_decoding_maps_and_rebuilt_once_it_grew(store, kept_run, monkeypatch):
    first = run_query(store, "coreference_summary", run=kept_run)
    group = helpers.summary_group(store, kept_run, "mention_argmax")
    assert group.attrs["stamp"] == {"version": 4, "n_examples": 8}
    heads = [{m["head"] for m in e[4]} & set(e[2]) for e in map(kept_example, range(8))]  # mention heads with a piece
    assert group["word"][:].tolist() == [h for e in heads for h in sorted(e)]
    assert group["attended"].shape == (sum(map(len, heads)), 2, 3)
    with monkeypatch.context() as m:
        helpers.forbid_map_reads(m, store)
        pd.testing.assert_frame_equal(run_query(store, "coreference_summary", run=kept_run), first, check_exact=True)
        run_query(store, "coreference", run=kept_run, examples=[4, 1])
    helpers.check_rebuilt_once_grown(  # as if built before the 8th example
        store,
        kept_run,
        "mention_argmax",
        lambda: assert_same(coreference_counts(store, kept_run), reference.coreference_counts(store, kept_run)),
    )


def test_a_run_without_mentions_reads_no_map(store, make_run, monkeypatch):
    tokens = [["[CLS]", "a", "b", "[SEP]"], ["[CLS]", "c", "[SEP]"]]
    maps = [np.full((1, 2, len(t), len(t)), 1 / len(t), dtype=np.float32) for t in tokens]
    run = make_run(store, maps, tokens, name="no-mentions")
    helpers.forbid_map_reads(monkeypatch, store)
    from attnstore.queries.errors import InvalidArgumentError

    for name in ("coreference", "coreference_summary"):  # not a table of NaN, nor "head 0-0" picked from one
        with pytest.raises(InvalidArgumentError, match=r"^run 'no-mentions': no coreference mention .* gum/ontogum:dev"):
            run_query(store, name, run=run)
    with pytest.raises(InvalidArgumentError, match=r"^the asked-for examples of run 'no-mentions': no coreference mention"):
        run_query(store, "coreference_summary", run=run, examples=[0])
    assert not helpers.has_summaries(store, run)  # and no pass built
    from attnstore.store.errors import NotFoundError

    with pytest.raises(NotFoundError, match=r"has no stored example\(s\) \[7\]"):
        run_query(store, "coreference", run=run, examples=[0, 7])


def test_mentions_words_and_tokens_are_read_one_range_at_a_time(store, kept_run, monkeypatch):
    """The pass that keeps the counts reads each range's rows; once they are kept, a whole-run call reads none."""
    expected = reference.coreference_counts(store, kept_run)
    monkeypatch.setattr("attnstore.queries.engine.kinds.SUMMARY_RANGE", 3)  # 8 examples: ranges of 3, 3 and 2
    asked = []
    for table in ("word_table", "mention_table", "token_table", "token_roles"):
        original = getattr(type(store), table)

        def recording(self, run, examples=None, original=original):
            asked.append(None if examples is None else len(list(examples)))
            return original(self, run, examples)

        monkeypatch.setattr(type(store), table, recording)
    assert_same(coreference_counts(store, kept_run), expected)
    assert asked and None not in asked and max(asked) <= 3  # never the whole run's rows
    asked.clear()
    assert summary.kept_ranges(store, store.run_info(kept_run), MENTION_ARGMAX).n == 3
    monkeypatch.setattr("attnstore.queries.engine.kept._summary_parts", lambda *a, **k: pytest.fail("read per-example fields"))
    assert_same(coreference_counts(store, kept_run), expected)  # the kept ranges' counts added
    assert asked == []
