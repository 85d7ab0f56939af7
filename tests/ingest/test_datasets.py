"""Built-in datasets on small excerpts of the real files (tests/fixtures/data mirrors ../shared/data)."""

import json
import re
from pathlib import Path

import pytest

from attnstore.ingest import builtin_source, file_source, register_dataset
from attnstore.ingest.coref import entity_brackets, read_gum_documents
from attnstore.ingest.datasets import BUILTIN, find_dataset, resolve_data_dir
from attnstore.ingest.errors import CorpusError, InvalidArgumentError, NotFoundError
from attnstore.ingest.framenet import char_span_to_words, read_exemplars_jsonl, read_release_xml, whitespace_words
from attnstore.ingest.runner import select_positions

DATA = Path(__file__).parents[1] / "fixtures" / "data"


def examples(key, **overrides):
    return list(builtin_source(key, str(DATA), **overrides).read())


def test_registry_and_unknown_names():
    keys = {s.key for s in BUILTIN}
    assert {
        "glue/MRPC:dev",
        "glue/RTE:dev",
        "glue/STS-B:dev",
        "glue/SST-2:train",
        "glue/QNLI:dev",
        "glue/MNLI:dev-matched-sample",
        "ud/en_ewt:train",
        "gum/ontogum:test",
        "framenet/1.5:exemplars",
    } <= keys
    with pytest.raises(InvalidArgumentError, match="no built-in dataset 'glue/MRPC:test'; choose one of: glue/MRPC:dev"):
        find_dataset("glue/MRPC:test")


def test_data_dir_option_beats_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("ATTNSTORE_DATA", str(tmp_path / "env"))
    assert resolve_data_dir(str(tmp_path / "opt")) == tmp_path / "opt"
    assert resolve_data_dir() == tmp_path / "env"
    with pytest.raises(NotFoundError, match="pass --data-dir .*ATTNSTORE_DATA"):
        builtin_source("glue/MRPC:dev")


def test_glue_quirks():
    mrpc = examples("glue/MRPC:dev")  # UTF-8 BOM before the header
    assert mrpc[0].text_a.startswith("He said the foodservice") and mrpc[0].label == "1" and mrpc[0].text_b
    rte = examples("glue/RTE:dev")  # HF export: CSV quoting, 0 = entailment, idx column
    amish = rte[3]
    assert amish.text_a.startswith("The Amish community") and not amish.text_a.startswith('"')
    assert [r.label for r in rte[:3]] == ["not_entailment", "entailment", "not_entailment"]
    assert [r.source_index for r in rte[:4]] == [0, 1, 2, 3]
    sst_train = examples("glue/SST-2:train")  # header says `text`
    assert sst_train[0].text_b is None and sst_train[0].label in {"0", "1"}
    assert examples("glue/SST-2:dev")[0].text_a.startswith("it 's a charming")
    stsb = examples("glue/STS-B:dev")
    assert float(stsb[0].label) == pytest.approx(5.0) and stsb[0].source_index == 0
    qnli = examples("glue/QNLI:dev")
    assert qnli[0].text_a.endswith("?") and qnli[0].label in {"entailment", "not_entailment"}
    mnli = examples("glue/MNLI:dev-matched-sample")
    assert (mnli[0].label, mnli[0].source_index) == ("contradiction", 1)  # GLUE row index kept


def test_ud_keeps_document_and_sentence_ids():
    sents = examples("ud/en_ewt:dev")
    assert sents[0].doc_id.startswith("weblog-") and sents[1].sent_id.endswith("-0002")
    assert sents[1].doc_id == sents[0].doc_id


def test_entity_brackets():
    assert entity_brackets("Discourse=x|Entity=(1(2)|MSeg=a") == [("open", "1"), ("single", "2")]
    assert entity_brackets("Entity=3)1)") == [("close", "3"), ("close", "1")]
    assert entity_brackets("SpaceAfter=No") == [] and entity_brackets(None) == []


def gold_mention_count(folder: Path) -> int:
    opened = 0
    for path in folder.glob("*.conllu"):
        for line in path.read_text(encoding="utf-8").splitlines():
            fields = line.split("\t")
            if len(fields) == 10 and re.fullmatch(r"\d+", fields[0]):
                for part in fields[9].split("|"):
                    if part.startswith("Entity="):
                        opened += part.count("(")
    return opened


def test_gum_documents_whole_with_window_words_0():
    """--window-words 0: one example per document (the long corpus for decoders), every mention in it."""
    whole = examples("gum/ontogum:dev", window_words=0)
    assert [w.doc_id for w in whole] == sorted({w.doc_id for w in whole}) and len(whole) == 2
    assert sum(len(w.mentions) for w in whole) == gold_mention_count(DATA / "gum_ontogum" / "dev")
    assert [len(w.words) for w in whole] == [sum(len(x.words) for x in examples("gum/ontogum:dev") if x.doc_id == w.doc_id) for w in whole]


def test_gum_windows_mentions_and_heads():
    windows = examples("gum/ontogum:dev", window_words=30)
    assert len({w.doc_id for w in windows}) == 2 and len(windows) > 2
    assert all(len(w.words) <= 30 or len({x["sentence"] for x in w.words}) == 1 for w in windows)
    mentions = [m for w in windows for m in w.mentions]
    assert len(mentions) == gold_mention_count(DATA / "gum_ontogum" / "dev")  # each mention in exactly one window
    for w in windows:
        for m in w.mentions:
            assert m["word_start"] <= m["head"] < m["word_end"] <= len(w.words)
            head = w.words[m["head"]]
            # the head's own head lies outside the mention (or it is the root)
            assert head["head"] is None or not m["word_start"] <= head["head"] < m["word_end"]
            assert m["kind"] == {"PRON": "pronoun", "PROPN": "proper"}.get(head["upos"], "nominal")
        text = w.text_a
        assert all(text[x["char_start"] : x["char_end"]] == x["form"] for x in w.words)
    byron = [w for w in windows if w.doc_id == "GUM_bio_byron"]
    orders = [m["doc_order"] for w in byron for m in w.mentions]
    assert orders == sorted(orders) and len(set(orders)) == len(orders)


def test_gum_unbalanced_brackets_name_the_line(tmp_path):
    doc = tmp_path / "doc.conllu"
    doc.write_text(
        "# sent_id = s1\n# text = A b\n1\tA\ta\tX\tX\t_\t0\troot\t_\tEntity=(1\n2\tb\tb\tX\tX\t_\t1\tdep\t_\t_\n\n", encoding="utf-8"
    )
    with pytest.raises(CorpusError, match=r"doc\.conllu:3: entity '1' is opened but never closed"):
        list(read_gum_documents(tmp_path))


def test_framenet_spans_map_to_words_on_hard_cases():
    sets = examples("framenet/1.5:exemplars")
    first = sets[0]
    frame = first.frames[0]
    assert (frame["frame"], frame["lu"]) == ("Causation", "cause.v")
    assert [w["form"] for w in first.words][frame["target_start"] : frame["target_end"]] == ["caused"]
    cause = next(fe for fe in frame["elements"] if fe["name"] == "Cause")
    assert (cause["word_start"], cause["word_end"], cause["in_core_set"], cause["core_type"]) == (0, 1, True, "Core")
    partial = next(s for s in sets if s.text_a.startswith("She peered"))
    wearer = next(fe for fe in partial.frames[0]["elements"] if fe["name"] == "Wearer")
    assert (wearer["char_start"], wearer["char_end"], wearer["word_start"], wearer["word_end"]) == (0, 1, 0, 1)  # "S" of "She"
    pound = next(s for s in sets if "£200" in s.text_a)
    effect = pound.frames[0]["elements"][0]
    assert [w["form"] for w in pound.words][effect["word_start"] : effect["word_end"]] == ["damage"]
    assert all(s.pretokenized for s in sets)


def test_char_span_to_words():
    words = whitespace_words("a bb  ccc ")
    assert [(w["char_start"], w["char_end"]) for w in words] == [(0, 1), (2, 4), (6, 9)]
    assert char_span_to_words(words, 2, 9) == (1, 3)
    assert char_span_to_words(words, 4, 6) == (None, None)  # only spaces


def test_framenet_bad_line(tmp_path):
    (tmp_path / "frames.jsonl").write_text("", encoding="utf-8")
    path = tmp_path / "ex.jsonl"
    good = (DATA / "framenet_v15" / "derived" / "lu_exemplars_max12tok.jsonl").read_text(encoding="utf-8").splitlines()[0]
    path.write_text(good + "\n" + json.dumps({"text": "x"}) + "\n", encoding="utf-8")
    with pytest.raises(CorpusError, match=r"ex\.jsonl:2: not an exemplar record"):
        list(read_exemplars_jsonl(path))


def test_framenet_release_xml(tmp_path):
    ns = 'xmlns="http://framenet.icsi.berkeley.edu"'
    (tmp_path / "frame").mkdir()
    (tmp_path / "lu").mkdir()
    (tmp_path / "frame" / "Causation.xml").write_text(
        f'<frame {ns} ID="5" name="Causation"><FE ID="1" name="Cause" coreType="Core"/>'
        f'<FE ID="2" name="Effect" coreType="Core"/><FEcoreSet><memberFE ID="1" name="Cause"/></FEcoreSet></frame>'
    )
    (tmp_path / "lu" / "lu2.xml").write_text(
        f'<lexUnit {ns} ID="2" name="cause.v" frame="Causation" frameID="5"><subCorpus name="s">'
        f'<sentence ID="7"><text>Rain caused floods .</text><annotationSet ID="9">'
        f'<layer rank="1" name="Target"><label start="5" end="10" name="Target"/></layer>'
        f'<layer rank="1" name="FE"><label start="0" end="3" name="Cause"/><label start="12" end="17" name="Effect"/></layer>'
        f"</annotationSet></sentence></subCorpus></lexUnit>"
    )
    (ex,) = list(read_release_xml(tmp_path))
    frame = ex.frames[0]
    assert (frame["annoset_id"], frame["target_start"], frame["target_end"]) == (9, 1, 2)
    fes = {fe["name"]: (fe["word_start"], fe["word_end"], fe["core_type"], fe["in_core_set"]) for fe in frame["elements"]}
    assert fes == {"Cause": (0, 1, "Core", True), "Effect": (2, 3, "Core", False)}


def test_sample_is_reproducible():
    a, suffix = select_positions(100, None, 10, seed=3)
    assert a == select_positions(100, None, 10, seed=3)[0] and a != select_positions(100, None, 10, seed=4)[0]
    assert len(a) == 10 and a == sorted(a) and suffix == "[sample=10,seed=3]"
    assert select_positions(5, 3, None, 0) == ([0, 1, 2], "[:3]")


def test_register_builtin_with_sample_and_mentions(store):
    source = builtin_source("gum/ontogum:dev", str(DATA), window_words=30)
    dataset_id, annotator = register_dataset(store, source, sample=3, seed=1, progress=False)
    again, _ = register_dataset(store, builtin_source("gum/ontogum:dev", str(DATA), window_words=30), sample=3, seed=1, progress=False)
    assert again == dataset_id and annotator == "gold"
    ds = store.sql("SELECT split, n_examples FROM datasets").iloc[0]
    assert (ds["split"], ds["n_examples"]) == ("dev[sample=3,seed=1]", 3)
    assert store.sql("SELECT count(*) AS n FROM mentions").n[0] > 0
    rows = store.sql("SELECT * FROM mention_antecedents")
    assert (rows["antecedent_start"] < rows["word_start"]).all() or (rows["mention_distance"] > 0).all()


def test_a_bad_record_writes_nothing(store, tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("sentence1\tsentence2\tlabel\n" + "A\tB\t1\n" * 300 + "broken row\n", encoding="utf-8")
    with pytest.raises(CorpusError, match=r"pairs\.tsv:302: expected 3 tab-separated fields"):
        register_dataset(store, file_source(str(path), "pairs-tsv"), annotator="whitespace", progress=False)
    assert store.sql("SELECT count(*) AS n FROM datasets").n[0] == 0
    assert store.sql("SELECT count(*) AS n FROM examples").n[0] == 0


def test_framenet_element_without_core_type_reads_as_unknown(tmp_path):
    """FrameNet 1.5's derived exemplars hold two FEs with coreType null (frame 965 does not define 'Dimension')."""
    import json

    from attnstore.ingest.framenet import read_exemplars_jsonl

    (tmp_path / "frames.jsonl").write_text(
        json.dumps({"frame_id": 965, "name": "Measurable_attributes", "FEs": [], "FEcoreSets": []}) + "\n", encoding="utf-8"
    )
    record = {
        "sent_id": 1,
        "annoset_id": 2,
        "lu_id": 3,
        "lu_name": "long.a",
        "frame_id": 965,
        "frame_name": "Measurable_attributes",
        "text": "Why this long discourse ?",
        "target": [[9, 13]],
        "fe": [[9, 13, "Dimension", None], [14, 23, "Entity", "Core"]],
    }
    (tmp_path / "ex.jsonl").write_text(json.dumps(record) + "\n", encoding="utf-8")
    (example,) = list(read_exemplars_jsonl(tmp_path / "ex.jsonl"))
    assert [(fe["name"], fe["core_type"]) for fe in example.frames[0]["elements"]] == [("Dimension", ""), ("Entity", "Core")]
