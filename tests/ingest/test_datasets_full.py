"""Counts of the full shared corpora (../shared/data), as documented in its README."""

from collections import Counter

import pytest

from attnstore.ingest.datasets import BUILTIN, dataset_path, find_dataset, read_dataset, resolve_data_dir

pytestmark = pytest.mark.slow
DATA = resolve_data_dir()
if not (DATA / "glue").is_dir():
    pytest.skip(f"the shared corpora are not at {DATA} (set ATTNSTORE_DATA)", allow_module_level=True)


@pytest.mark.parametrize("spec", [s for s in BUILTIN if not s.name.startswith("gum/")], ids=lambda s: s.key)
def test_example_counts(spec):
    assert sum(1 for _ in read_dataset(spec, DATA)) == spec.n_examples


@pytest.mark.parametrize(
    "key, labels",
    [
        ("glue/MRPC:dev", {"1": 279, "0": 129}),
        ("glue/RTE:dev", {"entailment": 146, "not_entailment": 131}),
        ("glue/SST-2:dev", {"1": 444, "0": 428}),
        ("glue/QNLI:dev", {"entailment": 2702, "not_entailment": 2761}),
        ("glue/MNLI:dev-matched-sample", {"entailment": 360, "neutral": 328, "contradiction": 336}),
    ],
)
def test_label_counts(key, labels):
    assert Counter(e.label for e in read_dataset(find_dataset(key), DATA)) == labels


@pytest.mark.parametrize("split, words", [("dev", 25147), ("test", 25094), ("train", 204577)])
def test_ud_word_counts(split, words):
    assert sum(len(s.words) for s in read_dataset(find_dataset(f"ud/en_ewt:{split}"), DATA)) == words


@pytest.mark.parametrize("split, sentences, words, mentions, entities", [("dev", 1575, 28119, 3818, 857), ("test", 1464, 28397, 3581, 858)])
def test_gum_counts(split, sentences, words, mentions, entities):
    spec = find_dataset(f"gum/ontogum:{split}")
    windows = list(read_dataset(spec, DATA))
    assert len({w.doc_id for w in windows}) == spec.n_examples == 30
    assert sum(len({x["sentence"] for x in w.words}) for w in windows) == sentences
    assert sum(len(w.words) for w in windows) == words
    assert sum(len(w.mentions) for w in windows) == mentions
    assert len({(w.doc_id, m["entity"]) for w in windows for m in w.mentions}) == entities
    assert dataset_path(spec, DATA).is_dir()
