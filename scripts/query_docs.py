"""Write docs/QUERY_REFERENCE.md from the query registry: every registered query's summary, parameters, CLI and
HTTP forms and docstring, read at run time (queries/engine/registry.py), so the reference cannot drift from the code.

    .venv/bin/python scripts/query_docs.py           # regenerate docs/QUERY_REFERENCE.md
    .venv/bin/python scripts/query_docs.py --check   # exit 1 when it is stale (tests/queries/test_registry.py runs this check)
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "QUERY_REFERENCE.md"
NARRATIVE = ROOT / "docs" / "QUERIES.md"
COMMAND = ".venv/bin/python scripts/query_docs.py"
PLACEHOLDER = {bool: "true", int: "INT", float: "NUMBER", str: "TEXT"}


def anchors(markdown: str) -> list[tuple[str, str]]:
    """(heading text, GitHub anchor) of every heading of `markdown`, duplicates suffixed -1, -2, ... as GitHub does."""
    out, seen = [], {}
    in_code = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        match = None if in_code else re.match(r"#{1,6} (.+)", line)
        if match:
            slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.append((match.group(1).strip(), f"{slug}-{n}" if n else slug))
    return out


def shown(value) -> str:
    """A default as it is written on the command line (`--param key=VALUE`)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def example_param(spec) -> str:
    """One `key=value` to show in the CLI and HTTP forms: the first parameter besides `examples`, at its default."""
    from attnstore.queries.engine.registry import param_type

    for name, p in spec.parameters().items():
        if name == "examples":
            continue
        if p.default is inspect.Parameter.empty or p.default is None:
            return f"{name}={PLACEHOLDER[param_type(spec, name)[0]]}"
        return f"{name}={shown(p.default)}"
    return "examples=0-9" if "examples" in spec.parameters() else ""


def sources_paragraph(sources: tuple[str, ...]) -> str:
    """The one paragraph on the engine's parameters, for every query over one run's maps (queries/engine/request.py)."""
    from attnstore.queries.engine import SOURCES

    shown = "; ".join(f"`{name}`: {SOURCES[name]}" for name in sources)
    only = "" if len(sources) > 1 else " (it reads more than the maps, so it answers from no other source)"
    return (
        "`examples` and `weights` are the query engine's, as for every query over one run's maps: `examples` limits it to "
        f"those example positions; `weights` is the map source it reads, {shown}{only}."
    )


def section(spec, headings: list[tuple[str, str]]) -> list[str]:
    from attnstore.queries.engine.registry import param_type

    name = spec.name
    lines = [f"## `{name}`", "", spec.summary, ""]
    narrative = next(((text, anchor) for text, anchor in headings if f"`{name}`" in text), None)
    if narrative:
        lines += [f"Definitions and conventions: [QUERIES.md: {narrative[0]}](QUERIES.md#{narrative[1]}).", ""]
    lines += [
        "Per head: " + ("yes (one row per layer and head; `--save` stores it in head_metrics)." if spec.per_head else "no."),
        "",
    ]
    params = spec.parameters()
    if params:
        lines += ["| parameter | type | default |", "|---|---|---|"]
        for key, p in params.items():
            kind, nullable = param_type(spec, key)
            if key == "examples":
                what, default = "example positions, e.g. `0,3,10-19`", "all examples"
            elif key == "weights" and spec.sources:
                what, default = "map source: " + " or ".join(f"`{source}`" for source in spec.sources), "`attention`"
            else:
                what = kind.__name__ + (" or none" if nullable else "")
                default = "required" if p.default is inspect.Parameter.empty else f"`{shown(p.default)}`"
            lines.append(f"| `{key}` | {what} | {default} |")
        lines.append("")
        if spec.sources:
            lines += [sources_paragraph(spec.sources), ""]
    else:
        lines += ["Parameters: none.", ""]
    body = inspect.cleandoc(spec.func.__doc__ or "").split("\n\n", 1)[1:]  # what follows the summary paragraph
    if body and body[0].strip():
        lines += ["```text", body[0].strip("\n"), "```", ""]
    param = example_param(spec)
    lines += [
        "```text",
        f"attnstore query {name} --run RUN" + (f" --param {param}" if param else ""),
        f"GET /api/runs/RUN/queries/{name}" + (f"?{param}" if param else ""),
        "```",
        "",
    ]
    return lines


def render() -> str:
    from attnstore.queries import QUERIES, load_all

    load_all(plugins=False)  # the reference is attnstore's own queries, whatever else is installed
    headings = anchors(NARRATIVE.read_text(encoding="utf-8"))
    lines = [
        "<!-- Generated by scripts/query_docs.py from the query registry and its docstrings: do not edit by hand; "
        f"regenerate with `{COMMAND}`. -->",
        "",
        "# Query reference (generated)",
        "",
        "Every registered query (`@register` in queries/, queries/engine/registry.py), sorted by name: its summary, parameters,",
        "docstring and how to run it. The papers, the reference code read and the conventions are in the hand-written",
        "[QUERIES.md](QUERIES.md).",
        "",
        "- Command line: `attnstore query NAME --run RUN [--param KEY=VALUE ...] [--save]` (`attnstore queries` lists them).",
        "- HTTP (`attnstore serve`): `GET /api/runs/{run}/queries/{name}?KEY=VALUE&...` (plus `max_rows`, `scan`), the run",
        "  by id or by name with any `/` sent as `%2F`; `POST /api/runs/{run}/queries/{name}/save` saves a per-head query",
        "  (`attnstore serve --allow-save`); `GET /api/queries` lists them.",
        "- Python: `attnstore.queries.run_query(store, NAME, run=RUN, KEY=VALUE, ...)`.",
        "- Values: `layer` and `head` are 0-based; booleans are `true`/`false`; a parameter that may be none takes `none`.",
        "",
        "| query | per head | summary |",
        "|---|---|---|",
    ]
    specs = sorted((s for s in QUERIES.values() if s.source == "attnstore"), key=lambda s: s.name)
    for spec in specs:
        summary = spec.summary.replace("|", "\\|")
        lines.append(f"| [`{spec.name}`](#{spec.name}) | {'yes' if spec.per_head else 'no'} | {summary} |")
    lines.append("")
    for spec in specs:
        lines += section(spec, headings)
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="Exit 1 if the reference is stale instead of writing it.")
    args = parser.parse_args(argv)
    text = render()
    current = REFERENCE.read_text(encoding="utf-8") if REFERENCE.exists() else ""
    if args.check:
        if current != text:
            print(f"{REFERENCE.relative_to(ROOT)} is stale (the registered queries changed): regenerate it with `{COMMAND}`")
            return 1
        return 0
    if current != text:
        REFERENCE.write_text(text, encoding="utf-8")
        print(f"wrote {REFERENCE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
