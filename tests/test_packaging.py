"""The wheel holds every package of the source tree: pyproject.toml lists them by hand (the repository root is the
package), so a new sub-package left out of the list would be missing from an installed attnstore."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_every_sub_package_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {"attnstore"}
    for top in ("api", "ingest", "migrations", "queries", "store"):
        for init in (ROOT / top).rglob("__init__.py"):
            found.add(".".join(("attnstore", *init.parent.relative_to(ROOT).parts)))
    assert found - listed == set(), f"add these to pyproject.toml [tool.setuptools] packages: {sorted(found - listed)}"
