import pytest

from attnstore.queries import QUERIES, get_query, load_all
from attnstore.queries.engine.registry import coerce_params
from attnstore.queries.errors import UnknownQueryError
from attnstore.store.errors import InvalidArgumentError


def test_first_queries_are_registered():
    load_all()
    assert {"relative_position", "special_tokens", "entropy"} <= set(QUERIES)
    for spec in QUERIES.values():
        assert spec.summary, f"{spec.name} needs a docstring"


def test_unknown_query_names_the_alternatives():
    with pytest.raises(UnknownQueryError, match="available: .*entropy"):
        get_query("entropyy")


def test_params_are_typed_and_checked():
    spec = get_query("special_tokens")
    assert coerce_params(spec, {"punct": ".,;"}) == {"punct": ".,;"}
    with pytest.raises(InvalidArgumentError, match="no parameter 'bogus'"):
        coerce_params(spec, {"bogus": "1"})


def test_examples_parameter_takes_positions_and_ranges():
    spec = get_query("entropy")
    assert coerce_params(spec, {"examples": "0,3,10-12"}) == {"examples": [0, 3, 10, 11, 12]}
    with pytest.raises(InvalidArgumentError, match="positions and ranges"):
        coerce_params(spec, {"examples": "x"})


def test_every_registered_query_is_documented():
    from pathlib import Path

    from attnstore.queries import QUERIES, load_all

    load_all()
    docs = (Path(__file__).parents[2] / "docs" / "QUERIES.md").read_text(encoding="utf-8")
    missing = [name for name in QUERIES if f"`{name}`" not in docs]
    assert not missing, f"queries missing from docs/QUERIES.md: {missing}"


def test_negative_layer_or_head_is_refused_before_the_store_is_read():
    spec = get_query("word_maps")
    with pytest.raises(InvalidArgumentError, match=r"parameter head of query 'word_maps' must be 0 or more .* not '-1'"):
        coerce_params(spec, {"head": "-1"})
    with pytest.raises(InvalidArgumentError, match=r"parameter layer of query 'cls_feature_attention' must be 0 or more"):
        coerce_params(get_query("cls_feature_attention"), {"layer": "-2"})
    assert coerce_params(spec, {"layer": "1", "head": "0"}) == {"layer": 1, "head": 0}


@pytest.mark.parametrize(
    "name, params, shown",
    [
        ("word_maps", {"head": -1}, "head of query 'word_maps' is -1"),  # was head 1 (the last) silently
        ("word_maps", {"layer": -1}, "layer of query 'word_maps' is -1"),
        ("word_maps", {"head": 2}, "head of query 'word_maps' is 2"),
        ("word_maps", {"layer": 2, "head": 0}, "layer of query 'word_maps' is 2"),
        ("cls_feature_attention", {"layer": -1}, "layer of query 'cls_feature_attention' is -1"),
        ("word_maps", {"head": True}, "head of query 'word_maps' is True"),
    ],
)
def test_run_query_refuses_layers_and_heads_the_model_lacks(store, hand_run, name, params, shown):
    from attnstore.queries import run_query

    with pytest.raises(InvalidArgumentError, match=rf"{shown}, out of range: run 'hand'.s model has 2 (layers|heads), numbered 0\.\.1"):
        run_query(store, name, run=hand_run, **params)


def test_run_query_names_a_parameter_the_query_does_not_take(store, hand_run):
    """From Python as on the command line: one InvalidArgumentError listing what it takes, not a TypeError."""
    from attnstore.queries import run_query

    with pytest.raises(InvalidArgumentError, match=r"^query 'entropy' has no parameter 'foo'; it takes: average, examples, weights$"):
        run_query(store, "entropy", run=hand_run, foo=1)
    with pytest.raises(InvalidArgumentError, match="has no parameter 'layers'"):
        store.run(hand_run).query("word_maps", layers=0)


def test_run_query_takes_every_real_layer_and_head(store, hand_run):
    from attnstore.queries import run_query

    frame = run_query(store, "word_maps", run=hand_run, layer=1, head=1)
    assert len(frame) and frame.groupby("from_unit")["attention"].sum().round(6).eq(1).all()
    assert store.run(hand_run).query("word_maps", layer=0, head=0) is not None


def test_query_command_refuses_a_negative_head_in_one_line(store, hand_run):
    from click.testing import CliRunner

    from attnstore.api.cli import main

    url = store.locations.db_url if store.engine.dialect.name == "sqlite" else store.engine.url.render_as_string(hide_password=False)
    where = ["--db", url, "--root", store.locations.array_root]
    for param, expect in (
        (
            "head=-1",
            "Error: parameter head of query 'word_maps' must be 0 or more (heads are numbered from 0), not '-1'; e.g. --param head=0",
        ),
        ("head=2", "Error: parameter head of query 'word_maps' is 2, out of range: run 'hand''s model has 2 heads, numbered 0..1"),
    ):
        result = CliRunner().invoke(main, ["query", "word_maps", "--run", hand_run, "--param", param, *where])
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert result.exit_code == 1 and lines == [expect], result.output


def test_every_query_module_is_discovered_without_a_list():
    """load_all imports every module of the package, so a query registers itself by being there (but not the compiled
    reduces, `_*`, imported by queries/engine/kernels.py when a query first needs one)."""
    import pkgutil
    import sys

    import attnstore.queries as queries

    queries.load_all()
    modules = {m.name for m in pkgutil.iter_modules(queries.__path__) if not m.name.startswith("_")}
    assert {f"attnstore.queries.{m}" for m in modules} <= set(sys.modules)
    registered = {spec.func.__module__.rsplit(".", 1)[1] for spec in queries.QUERIES.values()}
    assert registered <= modules and {"clark", "dependency", "patterns"} <= registered


def _script(name: str):
    """A module of scripts/ or benchmarks/ (not part of the package), imported from its file."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[2] / name
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_query_reference_is_current():
    """docs/QUERY_REFERENCE.md is generated from the registry and the queries' docstrings (scripts/query_docs.py)."""
    import difflib

    docs = _script("scripts/query_docs.py")
    current = docs.REFERENCE.read_text(encoding="utf-8") if docs.REFERENCE.exists() else ""
    expected = docs.render()
    if current != expected:
        diff = list(difflib.unified_diff(current.splitlines(), expected.splitlines(), "committed", "generated", lineterm="", n=1))
        pytest.fail(f"docs/QUERY_REFERENCE.md is stale: regenerate it with `{docs.COMMAND}`\n" + "\n".join(diff[:40]), pytrace=False)


def test_a_new_query_is_picked_up_by_the_cli_http_bench_and_reference(monkeypatch):
    """One registered function, no list to extend: `attnstore queries`, GET /api/queries, `make bench` and the
    generated reference all list it, with its parameters."""
    from click.testing import CliRunner

    from attnstore.api.cli import main
    from attnstore.queries import register

    load_all()
    monkeypatch.setitem(QUERIES, "zz_new", None)  # removed again after the test

    @register("zz_new", per_head=False)
    def zz_new(store, *, run, examples=None, width: int = 3, label: str | None = None):
        """A query made up for this test.

        Columns: layer, head, value.
        """

    listed = CliRunner().invoke(main, ["queries"])
    assert listed.exit_code == 0 and "zz_new" in listed.output and "width=3" in listed.output

    pytest.importorskip("fastapi")
    from attnstore.api.http.routes.queries import list_queries

    (entry,) = [q for q in list_queries()["queries"] if q["name"] == "zz_new"]
    assert entry["per_head"] is False and [p["name"] for p in entry["parameters"]] == ["examples", "width", "label"]

    monkeypatch.setitem(QUERIES, "zz_needs", None)

    @register("zz_needs")
    def zz_needs(store, *, run, other: str):
        """A query made up for this test, with a required parameter."""

    timed, skipped = _script("benchmarks/ingest_and_query.py").timed_queries(QUERIES)
    assert "zz_new" in timed and skipped == {"zz_needs": "skipped (needs --param other=...)"}

    text = _script("scripts/query_docs.py").render()
    assert "| [`zz_new`](#zz_new) | no | A query made up for this test. |" in text
    section = text.split("## `zz_new`", 1)[1]
    assert "| `width` | int | `3` |" in section and "| `label` | str or none | `none` |" in section
    assert "Columns: layer, head, value." in section
    assert "attnstore query zz_new --run RUN --param width=3" in section
    assert "GET /api/runs/RUN/queries/zz_new?width=3" in section
    assert "| `other` | str | required |" in text.split("## `zz_needs`", 1)[1]


def test_run_query_refuses_examples_that_are_not_positions(store, hand_run):
    """The engine's `examples=` (queries/engine/request.py) from Python: positions only, at least one, each named."""
    from attnstore.queries import run_query

    with pytest.raises(InvalidArgumentError, match=r"^examples=\['a'\]: give example positions \(integers\)"):
        run_query(store, "entropy", run=hand_run, examples=["a"])
    with pytest.raises(InvalidArgumentError, match=r"^examples=\[True\]: give example positions"):
        run_query(store, "entropy", run=hand_run, examples=[True])
    with pytest.raises(InvalidArgumentError, match=r"^examples='1-0': range '1-0' ends before it starts"):
        run_query(store, "entropy", run=hand_run, examples="1-0")
    with pytest.raises(InvalidArgumentError, match=r"^examples= selects no example"):
        run_query(store, "entropy", run=hand_run, examples="")
    assert len(run_query(store, "entropy", run=hand_run, examples="0")) == len(run_query(store, "entropy", run=hand_run, examples=[0]))
