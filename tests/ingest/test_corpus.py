from pathlib import Path

import pytest

from attnstore.ingest.corpus import read_conllu, read_pairs_tsv, read_text, validate_corpus
from attnstore.ingest.errors import CorpusError, EmptyCorpusError

FIXTURES = Path(__file__).parents[1] / "fixtures"


def test_mrpc_pairs_with_bom_and_glue_header():
    rows = list(read_pairs_tsv(FIXTURES / "mrpc_dev_head.tsv"))
    assert len(rows) == 12
    assert rows[0].text_a.startswith("He said the foodservice pie business")
    assert rows[0].text_b.startswith('"The foodservice pie business')  # quotes are text in GLUE files
    assert rows[0].label == "1" and rows[0].source_line == 2


def test_csv_quoted_pairs(tmp_path):
    path = tmp_path / "rte.tsv"
    path.write_text('sentence1\tsentence2\tlabel\tidx\n"He said ""hi""."\tHe spoke.\t0\t0\nA\tB\t1\t1\n', encoding="utf-8")
    rows = list(read_pairs_tsv(path, quoting="csv"))
    assert [r.text_a for r in rows] == ['He said "hi".', "A"]
    assert [r.label for r in rows] == ["0", "1"]


def test_text_skips_blank_lines_and_keeps_line_numbers(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("first line\n\n  second line  \n", encoding="utf-8")
    rows = list(read_text(path))
    assert [(r.position, r.text_a, r.source_line) for r in rows] == [(0, "first line", 1), (1, "second line", 3)]


def test_conllu_gold_words_multiword_tokens_and_empty_nodes():
    sents = list(read_conllu(FIXTURES / "ewt_dev_excerpt.conllu"))
    assert len(sents) == 6
    first = sents[0]
    assert first.doc_id.startswith("weblog-blogspot.com_nominations") and first.sent_id.endswith("-0001")
    assert [w["form"] for w in first.words] == ["From", "the", "AP", "comes", "this", "story", ":"]
    assert [w["head"] for w in first.words] == [2, 2, 3, None, 5, 3, 3]  # 0-based word positions, None = root
    assert first.words[3]["deprel"] == "root" and first.words[2]["upos"] == "PROPN"
    contraction = sents[2]
    forms = [w["form"] for w in contraction.words]
    i = forms.index("did")
    assert forms[i + 1] == "n't"  # the syntactic words of the multiword token "didn't"
    text = contraction.text_a
    assert text[contraction.words[i]["char_start"] : contraction.words[i + 1]["char_end"]] == "didn't"
    with_empty = sents[3]
    assert all("." not in str(w["position"]) for w in with_empty.words)
    assert len(with_empty.words) == max(w["position"] for w in with_empty.words) + 1


def test_conllu_char_spans_match_the_text():
    for sent in read_conllu(FIXTURES / "ewt_dev_excerpt.conllu"):
        for w in sent.words:
            assert sent.text_a[w["char_start"] : w["char_end"]] == w["form"], (sent.sent_id, w)


@pytest.mark.parametrize(
    "content, line, problem",
    [
        ("sentence1\tsentence2\tlabel\nA\tB\t1\nonly one field\n", 3, "expected 3 tab-separated fields, found 1"),
        ("sentence1\tsentence2\tlabel\nA\t\t1\n", 2, "empty text in column 'sentence2'"),
        ("foo\tbar\nA\tB\n", 1, "cannot tell the two text columns"),
    ],
)
def test_malformed_tsv_names_file_and_line(tmp_path, content, line, problem):
    path = tmp_path / "bad.tsv"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(CorpusError) as err:
        validate_corpus(path, "pairs-tsv")
    assert f"{path}:{line}: {problem}" in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "content, line, problem",
    [
        ("1\tA\ta\tX\tX\t_\t0\troot\t_\t_\n2\tB\tb\tX\tX\t_\t1\n", 2, "expected 10 tab-separated CoNLL-U columns, found 7"),
        ("1\tA\ta\tX\tX\t_\t0\troot\t_\t_\n3\tB\tb\tX\tX\t_\t1\tdep\t_\t_\n", 2, "word ID 3 out of sequence"),
        ("1\tA\ta\tX\tX\t_\tzero\troot\t_\t_\n", 1, "HEAD 'zero' is not a number"),
        ("1\tA\ta\tX\tX\t_\t0\troot\t_\t_\n2\tB\tb\tX\tX\t_\t7\tdep\t_\t_\n", 2, "HEAD 7 points past"),
    ],
)
def test_malformed_conllu_names_file_and_line(tmp_path, content, line, problem):
    path = tmp_path / "bad.conllu"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(CorpusError, match=rf"bad\.conllu:{line}: {problem}"):
        validate_corpus(path, "conllu")


def test_non_utf8_names_the_line_and_the_fix(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("fine\ncaf\xe9 au lait\n".encode("latin-1"))
    with pytest.raises(CorpusError, match=r"latin1\.txt:2: not valid UTF-8 \(byte 0xe9 at column 4\); re-encode"):
        validate_corpus(path, "text")


@pytest.mark.parametrize("fmt, content", [("text", "\n\n  \n"), ("pairs-tsv", ""), ("conllu", "")])
def test_empty_corpus(tmp_path, fmt, content):
    path = tmp_path / "empty"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(EmptyCorpusError, match="the corpus has no examples"):
        validate_corpus(path, fmt)


def test_missing_file(tmp_path):
    with pytest.raises(CorpusError, match="no such file"):
        validate_corpus(tmp_path / "nope.txt", "text")
