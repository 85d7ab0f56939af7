"""A dataset's first load runs on a thread during its first run (ingest/feed.py): same words, same maps, same
storage order as a run of a dataset registered beforehand; a failed annotation leaves both resumable."""

from pathlib import Path

import numpy as np
import pytest

from attnstore.ingest import ingest, register_dataset, runner
from attnstore.ingest.annotate import WhitespaceAnnotator
from attnstore.store.check import check_store

pytestmark = pytest.mark.model
MRPC = Path(__file__).parents[1] / "fixtures" / "data" / "glue" / "MRPC" / "dev.tsv"


def first_pairs(tmp_path, n: int) -> str:
    """n sentence pairs of varied lengths (the fixture's MRPC pairs, numbered and lengthened)."""
    rows = [line.split("\t") for line in MRPC.read_text(encoding="utf-8-sig").splitlines()[1:]]
    lines = ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"]
    for k in range(n):
        label, a_id, b_id, a, b = rows[k % len(rows)]
        lines.append("\t".join([label, a_id, b_id, f"Pair {k}: " + " and so".join([a] * (1 + k % 3)), b]))
    path = tmp_path / "pairs.tsv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def layout(store, run: str):
    """Per example: its storage offset, tokens and maps."""
    seqs = store.sql(
        'SELECT e.position, s."offset" FROM sequences s JOIN examples e ON e.id = s.example_id '
        "JOIN runs r ON r.id = s.run_id WHERE r.name = :r ORDER BY e.position",
        {"r": run},
    )
    return [
        (int(p), int(o), store.tokens(run, int(p))["token"].tolist(), store.attention(run, int(p))) for p, o in seqs.itertuples(index=False)
    ]


def words(store):
    return store.sql(
        "SELECT e.position, w.position AS word, w.form, w.char_start FROM words w JOIN examples e ON e.id = w.example_id ORDER BY 1, 2"
    )


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 5 examples, so the run's batches wait on the feed several times."""
    monkeypatch.setattr(runner, "INSERT_BATCH", 5)


def test_first_ingest_equals_ingest_of_a_registered_dataset(store, loaded_model, tmp_path, small_chunks):
    from attnstore.store import migrate, open_store

    corpus = first_pairs(tmp_path, 23)
    fed = ingest(
        store, corpus=corpus, fmt="pairs-tsv", annotator="whitespace", loaded=loaded_model, batch_size=4, name="fed", progress=False
    )
    assert fed.run.status == "complete" and fed.run.n_stored == 23
    assert store.sql("SELECT status, n_examples FROM datasets").to_dict("records") == [{"status": "complete", "n_examples": 23}]
    assert store.sql("SELECT count(*) AS n FROM leases")["n"][0] == 0

    url = f"sqlite:///{tmp_path / 'other.sqlite'}"
    migrate.upgrade(url)
    other = open_store(db=url, root=str(tmp_path / "other.zarr"))
    try:
        register_dataset(other, runner.file_source(corpus, "pairs-tsv"), annotator="whitespace", progress=False)
        plain = ingest(
            other, corpus=corpus, fmt="pairs-tsv", annotator="whitespace", loaded=loaded_model, batch_size=4, name="plain", progress=False
        )
        assert plain.run.n_stored == 23
        assert words(store).equals(words(other))
        for (p, offset, tokens, maps), (q, offset2, tokens2, maps2) in zip(layout(store, "fed"), layout(other, "plain"), strict=True):
            assert (p, offset, tokens) == (q, offset2, tokens2)
            np.testing.assert_array_equal(maps, maps2)  # the same batches: bit-identical
    finally:
        other.close()


class FailingAnnotator(WhitespaceAnnotator):
    """Whitespace words, until the example at `fail_at` (in the second chunk) is annotated."""

    fail_at = ""

    def words(self, texts):
        if any(t.startswith(self.fail_at) for t in texts):
            raise RuntimeError("the annotator broke")
        return super().words(texts)


def test_an_annotation_failure_leaves_the_dataset_and_run_resumable(store, loaded_model, tmp_path, small_chunks, monkeypatch):
    corpus = first_pairs(tmp_path, 23)
    FailingAnnotator.fail_at = "Pair 7: "  # in the second chunk of 5
    monkeypatch.setattr(runner, "make_annotator", lambda kind: FailingAnnotator())
    with pytest.raises(RuntimeError, match="the annotator broke"):
        ingest(store, corpus=corpus, fmt="pairs-tsv", annotator="whitespace", loaded=loaded_model, batch_size=4, name="r", progress=False)
    assert store.sql("SELECT status FROM datasets")["status"].tolist() == ["loading"]
    assert store.sql("SELECT count(*) AS n FROM examples")["n"][0] == 5  # the first chunk, whole
    assert store.sql("SELECT status FROM runs")["status"].tolist() == ["interrupted"]
    assert store.sql("SELECT count(*) AS n FROM leases")["n"][0] == 0
    assert check_store(store, ["r"])[1].empty  # what the cut-off run committed is whole (here: nothing)
    assert list(store.iter_attention("r")) == [] and store.examples("r").empty

    monkeypatch.setattr(runner, "make_annotator", lambda kind: WhitespaceAnnotator())
    resumed = ingest(
        store, corpus=corpus, fmt="pairs-tsv", annotator="whitespace", loaded=loaded_model, batch_size=4, name="r", progress=False
    )
    assert resumed.run.status == "complete" and resumed.run.n_stored == 23
    assert store.sql("SELECT status, n_examples FROM datasets").to_dict("records") == [{"status": "complete", "n_examples": 23}]
    positions = [p for p, *_ in layout(store, "r")]
    assert positions == list(range(23))
    assert check_store(store, ["r"])[1].empty
