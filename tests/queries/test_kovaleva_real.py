"""Kovaleva queries on maps of the real model over a few fixture examples: they run and give sane values."""

from pathlib import Path

import pytest

from attnstore.ingest import ingest
from attnstore.queries import run_query

pytestmark = pytest.mark.model
DATA = str(Path(__file__).parents[1] / "fixtures" / "data")


def test_feature_and_token_queries_on_mrpc(store, loaded_model):
    run = ingest(store, dataset="glue/MRPC:dev", data_dir=DATA, loaded=loaded_model, progress=False).run
    n_layers, n_heads = run.n_layers, run.n_heads
    features = run_query(store, "feature_attention", run=run.name)
    assert len(features) == n_layers * n_heads * 8
    present = features[features["n_examples"] > 0]
    assert {"noun", "verb", "cls", "sep", "negation"} <= set(present["feature"])  # "does not" in the first pair
    assert present["value"].between(0, 1).all()
    assert (features.loc[features["feature"].isin(["cls", "sep"]), "n_examples"] == run.n_stored).all()
    pairs = run_query(store, "token_to_token", run=run.name)
    assert (pairs.loc[pairs["relation"] == "verb_to_subject", "n_examples"] > 0).all()
    assert pairs["value"].dropna().between(0, 1).all()
    cls = run_query(store, "cls_feature_attention", run=run.name)
    assert (cls["layer"] == n_layers - 1).all() and len(cls) == n_heads * 8
    assert cls["value"].dropna().between(0, 1).all()
    # the same examples stored again at another precision: the maps barely differ
    again = ingest(
        store, dataset="glue/MRPC:dev", data_dir=DATA, loaded=loaded_model, name="mrpc-float32", dtype="float32", progress=False
    ).run
    sim = run_query(store, "run_similarity", run=run.name, other=again.name)
    assert (sim["n_examples"] == run.n_stored).all()
    assert sim["similarity"].min() > 0.999


def test_frame_heads_on_framenet_exemplars(store, loaded_model):
    run = ingest(store, dataset="framenet/1.5:exemplars", data_dir=DATA, loaded=loaded_model, progress=False).run
    df = run_query(store, "frame_heads", run=run.name)
    assert len(df) == run.n_layers * run.n_heads and (df["n_sentences"] >= 1).all()
    assert df["value"].between(0, 1).all() and df["top"].sum() >= 1
    counts = df.attrs["filter_counts"]
    assert counts["annotation_sets"] == run.n_stored and counts["with_tokens"] == df["n_sentences"].iloc[0]
