"""No import cycles inside a layer (issue 25): within store/, ingest/, queries/ and api/, no two modules import each
other, directly or through others, function-level imports included (annotation-only TYPE_CHECKING imports excluded,
as in the import-linter contracts of `make lint`, which check the layers between the packages)."""

import itertools

import pytest

grimp = pytest.importorskip("grimp")  # installed with import-linter (the test extra)


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("attnstore", include_external_packages=False, exclude_type_checking_imports=True, cache_dir=None)


@pytest.mark.parametrize("package", ["store", "ingest", "queries", "api"])
def test_no_module_of_a_layer_imports_itself_back(graph, package):
    modules = sorted(m for m in graph.modules if m == f"attnstore.{package}" or m.startswith(f"attnstore.{package}."))
    cycles = [
        " -> ".join(graph.find_shortest_chain(importer=a, imported=b)) + " -> ... -> " + a
        for a, b in itertools.combinations(modules, 2)
        if graph.chain_exists(importer=a, imported=b) and graph.chain_exists(importer=b, imported=a)
    ]
    assert not cycles, f"import cycles in attnstore.{package}: " + "; ".join(cycles)
