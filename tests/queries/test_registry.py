import pytest

from attnstore.queries import QUERIES, get_query, load_all
from attnstore.queries.errors import UnknownQueryError
from attnstore.queries.registry import coerce_params
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
