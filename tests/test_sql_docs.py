"""Every SQL example of docs/SQL.md runs on SQLite and PostgreSQL against real (excerpted) corpora."""

import re
from pathlib import Path

import pytest

from attnstore.ingest import builtin_source, ingest, register_dataset
from attnstore.queries import run_query

DOC = Path(__file__).parents[1] / "docs" / "SQL.md"
DATA = str(Path(__file__).parent / "fixtures" / "data")


def statements() -> list[str]:
    blocks = re.findall(r"```sql\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)
    return [b.strip().rstrip(";") for b in blocks]


@pytest.mark.model
def test_sql_examples_run_and_answer(store, loaded_model):
    register_dataset(store, builtin_source("glue/RTE:dev", DATA), progress=False)
    register_dataset(store, builtin_source("gum/ontogum:dev", DATA, window_words=60), progress=False)
    run = ingest(store, dataset="framenet/1.5:exemplars", data_dir=DATA, loaded=loaded_model, progress=False).run
    for name in ("relative_position", "entropy"):
        store.save_head_metrics(run.name, run_query(store, name, run=run.name), prefix=name)
    objects, antecedents, by_kind, framenet, pieces, heads = (store.sql(s) for s in statements())

    # "not delivering enough hot new products": the object noun of a negated RTE sentence
    assert "products" in set(objects["form"])
    negated = set(store.sql("SELECT example FROM negated_examples WHERE dataset = 'glue/RTE'")["example"])
    assert set(objects["example"]) <= negated

    assert len(antecedents) > 0 and set(antecedents["kind"]) <= {"pronoun", "proper", "nominal"}
    assert (antecedents["mention_distance"] > 0).all()
    assert by_kind["mentions"].sum() == store.sql("SELECT count(*) AS n FROM mentions").n[0]
    assert (by_kind["with_antecedent"] <= by_kind["mentions"]).all()

    spans = store.sql("SELECT * FROM frame_element_spans").dropna(subset=["word_start"])
    far = spans[
        (spans["core_type"] == "Core")
        & ((spans["word_start"] >= spans["target_end"] + 1) | (spans["word_end"] <= spans["target_start"] - 1))
    ]
    assert len(framenet) == len(far) > 0
    assert sorted(zip(framenet["example_id"], framenet["element"])) == sorted(zip(far["example_id"], far["element"]))
    assert "damage" in set(pieces["token"]) and set(pieces["run"]) == {run.name}
    assert list(heads.columns) == ["layer", "head", "to_previous", "entropy"]
    assert ((heads["to_previous"] > 0.5) & (heads["entropy"] < 2)).all()
