"""One corpus, two dataset names (issue 24, item 15): a GLUE file ingested with --corpus is named after its
folder (`RTE`), the built-in `glue/RTE`. docs/SQL.md's examples match both names, so they find the
file-ingested data too (the fix is in the documentation: run names derive from dataset names)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from attnstore.api.cli import main
from attnstore.ingest import file_source, register_dataset

ROOT = Path(__file__).parents[1]
RTE = ROOT / "tests" / "fixtures" / "data" / "glue" / "RTE" / "dev.tsv"


def first_sql_example() -> str:
    return re.findall(r"```sql\n(.*?)```", (ROOT / "docs" / "SQL.md").read_text(encoding="utf-8"), flags=re.S)[0].strip().rstrip(";")


@pytest.mark.model  # spaCy annotates the file
def test_the_documented_query_finds_a_file_ingested_corpus(store):
    # what `attnstore ingest --corpus .../glue/RTE/dev.tsv --format pairs-tsv --quoting csv` registers: dataset "RTE"
    source = file_source(str(RTE), "pairs-tsv", text_a="sentence1", text_b="sentence2", label="label", quoting="csv")
    assert source.name == "RTE"
    register_dataset(store, source, progress=False)
    assert list(store.sql("SELECT name FROM datasets")["name"]) == ["RTE"]
    objects = store.sql(first_sql_example())
    assert "products" in set(objects["form"])  # "not delivering enough hot new products", as for glue/RTE


def test_sql_doc_says_how_to_match_both_names():
    doc = (ROOT / "docs" / "SQL.md").read_text(encoding="utf-8")
    assert "WHERE dataset IN ('glue/MRPC', 'MRPC')" in doc and "--dataset-name glue/MRPC" in doc
    assert "WHERE w.dataset IN ('glue/RTE', 'RTE')" in first_sql_example()


def test_ingest_help_says_where_the_dataset_name_comes_from():
    result = CliRunner().invoke(main, ["ingest", "--help"], terminal_width=200)
    text = " ".join(result.output.split())
    assert "Dataset name (default: the file's folder name, e.g. MRPC for .../glue/MRPC/dev.tsv" in text
    assert "give --dataset-name glue/MRPC for one name" in text
