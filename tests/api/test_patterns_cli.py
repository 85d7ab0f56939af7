"""`attnstore patterns`: render -> label -> import -> export round trip, bad label files, classify and Fig 2."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from attnstore.api.cli import main
from attnstore.queries import run_query
from attnstore.tests.snapshots import store_with

TOKENS = [["[CLS]", "a", "b", "c", "d", "[SEP]", "e", "f", "[SEP]"], ["[CLS]", "x", "y", "z", "[SEP]"]]


def maps_for(length: int) -> np.ndarray:
    """(2 layers, 3 heads, L, L): [CLS] column, previous token, uniform; twice."""
    m = np.zeros((3, length, length), dtype=np.float32)
    m[0, :, 0] = 1
    m[1, 0, 0] = 1
    for i in range(1, length):
        m[1, i, i - 1] = 1
    m[2] = 1 / length
    return np.stack([m, m])


@pytest.fixture
def labelled_store(store):
    return store, "tiny"


def build_labelled_store(store, make_run):
    make_run(store, [maps_for(len(t)) for t in TOKENS], TOKENS, name="tiny")


# For a test of `labelled_store`: the store build_labelled_store fills, built once per session on SQLite and copied (tests/snapshots.py).
store = store_with("labelled_store", build_labelled_store)


def store_args(store):
    return ["--db", store.locations.db_url, "--root", store.locations.array_root]


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.mark.one_backend
def test_render_import_export_round_trip(labelled_store, tmp_path):
    store, run = labelled_store
    out = tmp_path / "render"
    result = invoke("patterns", "render", "--run", run, "--n", 12, "--seed", 3, "--out", out, *store_args(store))
    assert result.exit_code == 0, result.output
    assert (out / "page_001.png").stat().st_size > 0 and not (out / "page_002.png").exists()
    sample = [json.loads(line) for line in (out / "sample.jsonl").read_text().splitlines()]
    assert len(sample) == 12 and len({s["id"] for s in sample}) == 12
    assert {s["model"] for s in sample} == {"hand-tiny"} and {s["split"] for s in sample} == {"test"}
    assert len({(s["example"], s["layer"], s["head"]) for s in sample}) == 12  # never the same map twice
    assert {(s["layer"], s["head"]) for s in sample} == {(layer, head) for layer in range(2) for head in range(3)}  # all heads
    assert all(s["source_row"] == s["example"] for s in sample)  # no source_index: the position
    # label every map by its head, as a person would from the pictures
    by_head = {0: "vertical", 1: "diagonal", 2: "heterogeneous"}
    labels = tmp_path / "labels.jsonl"
    lines = [
        dict(
            model=s["model"],
            dataset=s["dataset"],
            split=s["split"],
            source_row=s["source_row"],
            layer=s["layer"],
            head=s["head"],
            label=by_head[s["head"]],
            labeller="test",
            id=s["id"],
        )
        for s in sample
    ]
    labels.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = invoke("patterns", "import", labels, *store_args(store))
    assert result.exit_code == 0, result.output
    assert "imported 12 label(s)" in result.output
    stored = store.pattern_labels(run, source="human")
    assert len(stored) == 12 and set(stored["source"]) == {"human"}
    assert (stored["label"] == stored["head"].map(by_head)).all()
    exported = tmp_path / "exported.jsonl"
    result = invoke("patterns", "export", "--labeller", "test", "--output", exported, *store_args(store))
    assert result.exit_code == 0, result.output
    key = ("model", "dataset", "split", "source_row", "layer", "head", "label", "labeller")
    expected = sorted(tuple(line[k] for k in key) for line in lines)
    assert [tuple(json.loads(line)[k] for k in key) for line in exported.read_text().splitlines()] == expected
    assert set(json.loads(exported.read_text().splitlines()[0])) == set(key)
    # importing the export again relabels the same rows, never duplicates them
    assert invoke("patterns", "import", exported, *store_args(store)).exit_code == 0
    assert len(store.pattern_labels(run)) == 12


GOOD = dict(model="hand-tiny", dataset="hand-tiny", split="test", source_row=0, layer=0, head=0, label="vertical", labeller="t")


def line(**changes) -> str:
    return json.dumps({k: v for k, v in dict(GOOD, **changes).items() if v != "DROP"})


@pytest.mark.parametrize(
    "second, message",
    [
        (line(label="stripes"), "labels.jsonl:2: unknown label 'stripes'; expected one of vertical, diagonal"),
        (line(source_row=9), "labels.jsonl:2: source row 9 is not a stored example of run(s) tiny"),
        (line(model="bert"), "labels.jsonl:2: no run of model 'bert' over hand-tiny:test in this store"),
        (line(head=3), "labels.jsonl:2: layer 0, head 3 is out of range for run 'tiny'"),
        (line(layer=-1), "labels.jsonl:2: layer must be a non-negative integer"),
        (line(labeller=None), "labels.jsonl:2: labeller must be a non-empty string"),
        ("{not json", "labels.jsonl:2: not a JSON object"),
        (line(head=1), "labels.jsonl:2: the same map as line 1"),
        (line(split="DROP"), "labels.jsonl:2: missing split"),
    ],
)
@pytest.mark.one_backend
def test_bad_label_lines_are_refused_in_one_line_and_nothing_is_written(labelled_store, tmp_path, second, message):
    store, _ = labelled_store
    path = tmp_path / "labels.jsonl"
    path.write_text(line(head=1) + "\n" + second + "\n")
    result = invoke("patterns", "import", path, *store_args(store))
    assert result.exit_code == 1
    lines = [text for text in result.output.splitlines() if text.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: ") and message in lines[0], result.output
    assert store.pattern_labels().empty


@pytest.mark.one_backend
def test_import_of_a_missing_file_and_export_of_nothing(labelled_store, tmp_path):
    store, _ = labelled_store
    result = invoke("patterns", "import", tmp_path / "none.jsonl", *store_args(store))
    assert result.exit_code == 1 and "no label file" in result.output
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert "no labels" in invoke("patterns", "import", empty, *store_args(store)).output
    result = invoke("patterns", "export", *store_args(store))
    assert result.exit_code == 0 and result.output == ""


@pytest.mark.one_backend
def test_classify_with_rules_saves_labels_and_figure(labelled_store, tmp_path):
    store, run = labelled_store
    result = invoke("patterns", "classify", "--run", run, "--save", "--format", "json", *store_args(store))
    assert result.exit_code == 0, result.output
    shares = json.loads(result.output[result.output.index("[") :])[0]
    assert shares["n_maps"] == 12 and shares["n_examples"] == 2
    expected = run_query(store, "pattern_proportions", run=run).set_index("label")["fraction"]
    assert [shares[c] for c in expected.index] == pytest.approx(expected.tolist())
    assert len(store.pattern_labels(run, source="rules")) == 12
    result = invoke("patterns", "classify", "--run", run, "--classifier", "cnn", *store_args(store))
    assert result.exit_code == 1 and "needs --model-file" in result.output
    out = tmp_path / "fig"
    result = invoke("patterns", "figure", "--run", run, "--source", "rules", "--out", out, *store_args(store))
    assert result.exit_code == 0, result.output
    assert (out / "fig2_pattern_classes.png").exists() and (out / "fig2_pattern_classes.svg").exists()
    table = (out / "fig2_pattern_classes.csv").read_text().splitlines()
    assert table[0].startswith("task,run,model,split,n_examples,n_maps,vertical,diagonal")
    result = invoke("patterns", "figure", "--run", run, "--source", "cnn", "--out", out, *store_args(store))
    assert result.exit_code == 1 and "no pattern labels from source 'cnn'" in result.output
