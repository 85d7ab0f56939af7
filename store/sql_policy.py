"""What `attnstore sql` / `Store.sql` / `/api/sql` may read: the store, and nothing else.

An allow-list, the same on both backends, checked on what the database itself will run:

- **one statement**: a query (``SELECT``, ``WITH ... SELECT``, ``VALUES``, ``TABLE name``),
  or ``EXPLAIN`` of one; on SQLite also the introspection PRAGMAs of store/readonly.py;
- **relations**: the store's own tables and views -- on PostgreSQL those of the store's schema,
  the statement's own CTEs and, for finding one's way, ``information_schema.tables/columns/
  views``; no system catalog (``pg_authid``, ``pg_shadow``, ``pg_stat_activity``, ...), no
  other schema. On SQLite the file is the store: any of its tables, ``sqlite_schema`` and the
  table functions of the introspection PRAGMAs and of JSON, but not the ``temp`` schema;
- **functions**: the ordinary ones in ``ALLOWED_FUNCTIONS`` (aggregates, window functions,
  arithmetic, text, dates, JSON, arrays, ``generate_series``): no function with a side effect
  (signals, ``pg_terminate_backend``, advisory locks, ``set_config``, file or large-object
  access, ``nextval``, ``pg_sleep``), none that runs SQL given as text, no ``zeroblob``. PostgreSQL
  also calls a one-argument function written as a field (``r.pg_typeof``, ``(pid).pg_terminate_backend``:
  its "functional notation" through attribute syntax), so a name after a dot that is such a function
  and no column of the store is refused unless it is an allowed function.

PostgreSQL statements are parsed by pglast, which is PostgreSQL's own parser (libpg_query), so
the check sees the statement as the server will; the statement then still runs in a read-only
transaction, as ``pg_read_all_data`` when the URL is a superuser's (store/readonly.py). SQLite
statements are checked by SQLite itself, through an authorizer that sees every table read and
every function call, views' bodies included.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from .errors import InvalidArgumentError

WRITE_HINT = "use a SQLite/PostgreSQL client with write access to change the store"
DOCS = "docs/CLI.md#attnstore-sql"

# Ordinary functions: no side effect, no access outside the statement's relations, no SQL as text.
COMMON_FUNCTIONS = frozenset(
    """
    count sum avg min max total group_concat string_agg array_agg json_agg jsonb_agg json_object_agg jsonb_object_agg
    bool_and bool_or every bit_and bit_or stddev stddev_pop stddev_samp variance var_pop var_samp corr covar_pop covar_samp
    regr_slope regr_intercept regr_r2 regr_count regr_avgx regr_avgy percentile_cont percentile_disc mode median
    row_number rank dense_rank percent_rank cume_dist ntile lag lead first_value last_value nth_value
    abs round trunc ceil ceiling floor sqrt cbrt exp ln log log10 log2 power pow mod sign div greatest least pi
    degrees radians sin cos tan asin acos atan atan2 sinh cosh tanh width_bucket random
    length char_length character_length octet_length bit_length lower upper initcap substr substring left right
    trim btrim ltrim rtrim lpad rpad replace concat concat_ws position strpos instr split_part reverse repeat format
    printf regexp_replace regexp_match regexp_matches regexp_split_to_array regexp_split_to_table regexp_like
    regexp_count regexp_substr regexp_instr starts_with md5 to_char to_number translate ascii chr unicode char
    quote_ident quote_literal quote_nullable quote string_to_array array_to_string string_to_table hex
    coalesce ifnull nullif iif typeof like glob
    unnest array_length array_lower array_upper array_ndims array_dims cardinality array_position array_positions
    array_remove array_replace array_append array_prepend array_cat generate_series generate_subscripts
    json jsonb json_valid json_type json_extract json_array json_object json_array_length json_group_array
    json_group_object json_each json_tree json_quote json_insert json_patch json_remove json_set
    json_build_object jsonb_build_object json_build_array jsonb_build_array to_json to_jsonb row_to_json array_to_json
    json_extract_path json_extract_path_text jsonb_extract_path jsonb_extract_path_text jsonb_array_length
    jsonb_each json_each_text jsonb_each_text json_array_elements jsonb_array_elements json_array_elements_text
    jsonb_array_elements_text json_typeof jsonb_typeof json_object_keys jsonb_object_keys jsonb_pretty jsonb_strip_nulls
    jsonb_path_query jsonb_path_exists jsonb_path_match
    now date time datetime julianday strftime unixepoch date_trunc date_part extract age to_timestamp to_date
    make_date make_time make_timestamp make_interval justify_days justify_hours justify_interval isfinite
    num_nulls num_nonnulls
    """.split()
)
# SQLite evaluates `a -> b` / `a ->> b` as calls of these (JSON operators, 3.38+).
SQLITE_OPERATOR_FUNCTIONS = frozenset({"->", "->>"})
ALLOWED_FUNCTIONS = COMMON_FUNCTIONS | SQLITE_OPERATOR_FUNCTIONS

PG_INTROSPECTION_RELATIONS = frozenset(
    {("information_schema", "tables"), ("information_schema", "columns"), ("information_schema", "views")}
)


def one_line(query: str, width: int = 60) -> str:
    text = " ".join(query.split()).rstrip(";").strip()
    return text if len(text) <= width else text[: width - 3] + "..."


def not_allowed(what: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"SQL error: not allowed in attnstore sql (read-only): {what}; {WRITE_HINT}")


def not_a_store_relation(name: str) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"SQL error: attnstore sql reads only the store's own tables and views, not {name} (what is allowed: {DOCS})"
    )


def function_not_allowed(name: str) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"SQL error: attnstore sql does not call {name}() (only ordinary functions without side effects; the list: {DOCS})"
    )


def attribute_call_not_allowed(shown: str, name: str) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"SQL error: attnstore sql does not call {name}() written as a field ({shown}: PostgreSQL reads x.{name} as "
        f"{name}(x) where x has no column {name}); only ordinary functions without side effects, and columns ({DOCS})"
    )


# ------------------------------------------------------------------ PostgreSQL (pglast)


def _fields(node: Any) -> Iterator[Any]:
    for name in type(node).__slots__:
        value = getattr(node, name, None)
        if value is not None:
            yield value


def _nodes(value: Any) -> Iterator[Any]:
    """The pglast nodes in a field value (a node, or nested tuples of them)."""
    from pglast import ast

    if isinstance(value, ast.Node):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _nodes(item)


class _PgChecker:
    def __init__(self, relations: frozenset[str], schema: str, functions: frozenset[str] | None, columns: frozenset[str]):
        self.relations = relations
        self.schema = schema
        self.functions = functions  # names of functions one argument can call (None: any name may be one)
        self.columns = columns  # the store's column names: a field of that name is read as the column

    def statement(self, stmt: Any, text: str) -> None:
        from pglast import ast

        if isinstance(stmt, ast.ExplainStmt):
            stmt = stmt.query
        if not isinstance(stmt, ast.SelectStmt):
            raise not_allowed(one_line(text))
        self.visit(stmt, frozenset())

    def visit(self, node: Any, ctes: frozenset[str]) -> None:
        from pglast import ast

        if isinstance(node, ast.SelectStmt):
            if node.intoClause is not None:
                raise not_allowed("SELECT ... INTO")
            if node.lockingClause:
                raise not_allowed("SELECT ... FOR UPDATE/SHARE (row locks)")
            if node.withClause is not None:
                ctes = self.with_clause(node.withClause, ctes)
            for value in _fields(node):
                if value is not node.withClause:
                    self.visit_all(value, ctes)
            return
        if isinstance(node, (ast.InsertStmt, ast.UpdateStmt, ast.DeleteStmt, ast.MergeStmt)):
            raise not_allowed("data-modifying WITH")
        if isinstance(node, ast.RangeVar):
            self.relation(node, ctes)
        elif isinstance(node, ast.FuncCall):
            self.function(node)
        elif isinstance(node, ast.ColumnRef):
            names = [str(f.sval) for f in node.fields or () if isinstance(f, ast.String)]
            self.attributes(names[1:], ".".join(names))
        elif isinstance(node, ast.A_Indirection):
            names = [str(f.sval) for f in node.indirection or () if isinstance(f, ast.String)]
            self.attributes(names, "(...)." + ".".join(names))
        for value in _fields(node):
            self.visit_all(value, ctes)

    def visit_all(self, value: Any, ctes: frozenset[str]) -> None:
        for child in _nodes(value):
            self.visit(child, ctes)

    def with_clause(self, clause: Any, outer: frozenset[str]) -> frozenset[str]:
        """Check each CTE's body where its name is visible as PostgreSQL scopes it; the names seen after."""
        names = [cte.ctename for cte in clause.ctes]
        if clause.recursive:
            visible = outer | frozenset(names)
            for cte in clause.ctes:
                self.visit_all(cte.ctequery, visible)
            return visible
        visible = outer
        for cte in clause.ctes:  # a plain CTE sees only the CTEs before it, not itself
            self.visit_all(cte.ctequery, visible)
            visible = visible | {cte.ctename}
        return visible

    def relation(self, node: Any, ctes: frozenset[str]) -> None:
        name = node.relname
        schema = node.schemaname
        shown = ".".join(p for p in (node.catalogname, schema, name) if p)
        if node.catalogname is not None:
            raise not_a_store_relation(shown)
        if schema is None and name in ctes:
            return
        if (schema, name) in PG_INTROSPECTION_RELATIONS:
            return
        # pg_catalog comes first in PostgreSQL's search path: a name starting pg_ would be found there.
        if schema in (None, self.schema) and name in self.relations and not name.startswith("pg_"):
            return
        raise not_a_store_relation(shown)

    def attributes(self, names: list[str], shown: str) -> None:
        """Names after a dot: PostgreSQL reads `x.f` / `(x).f` as the call f(x) where x has no column or field f (its
        functional notation), so such a name that a function of one argument has must be an allowed function or a
        column of the store (store columns named after a function -- name, host -- are read as the column)."""
        for name in names:
            if name in COMMON_FUNCTIONS or name in self.columns or name in self.relations:
                continue
            if self.functions is None or name in self.functions:
                raise attribute_call_not_allowed(shown, name)

    def function(self, node: Any) -> None:
        parts = [p.sval for p in node.funcname]
        name = parts[-1]
        if len(parts) > 2 or (len(parts) == 2 and parts[0] != "pg_catalog") or name not in COMMON_FUNCTIONS:
            raise function_not_allowed(".".join(parts))


def check_pg_statement(
    text: str,
    relations: Iterable[str],
    schema: str = "public",
    *,
    functions: Iterable[str] | None = None,
    columns: Iterable[str] = (),
) -> bool:
    """Refuse (InvalidArgumentError) `text` unless it is one query over `relations` (the store's
    tables and views in `schema`) calling only allowed functions. `text` is what the server receives.
    `functions`: the names a one-argument call can have on this server (PG_ONE_ARGUMENT_FUNCTIONS_SQL; None: a name
    after a dot must be an allowed function or one of `columns`, the store's column names).
    Returns False for an EXPLAIN, True for a query (whose rows a server-side cursor can read)."""
    try:
        import pglast
    except ImportError:
        raise InvalidArgumentError("SQL error: SQL on a PostgreSQL store needs pglast: pip install 'attnstore[postgres]'") from None
    try:
        statements = pglast.parse_sql(text)
    except pglast.parser.ParseError as exc:
        raise InvalidArgumentError(f"SQL error: {exc.args[0] if exc.args else exc}") from None
    if not statements:
        raise InvalidArgumentError("SQL error: empty statement")
    if len(statements) > 1:
        raise InvalidArgumentError(f"SQL error: attnstore sql runs one statement at a time (found {len(statements)})")
    stmt = statements[0].stmt
    known = None if functions is None else frozenset(functions)
    _PgChecker(frozenset(relations), schema, known, frozenset(columns)).statement(stmt, text)
    return not isinstance(stmt, pglast.ast.ExplainStmt)


PG_STORE_RELATIONS_SQL = (
    "SELECT c.relname, n.nspname FROM pg_catalog.pg_class c "
    "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = pg_catalog.current_schema() AND c.relkind IN ('r', 'v', 'm', 'p', 'f')"
)

# Names a call with one argument can have (what `x.name` / `(x).name` may call), and the store's column names.
PG_ONE_ARGUMENT_FUNCTIONS_SQL = (
    "SELECT DISTINCT p.proname FROM pg_catalog.pg_proc p "
    "WHERE (p.pronargs >= 1 AND p.pronargs - p.pronargdefaults <= 1) OR p.provariadic <> 0"
)
PG_STORE_COLUMNS_SQL = (
    "SELECT DISTINCT a.attname FROM pg_catalog.pg_attribute a "
    "JOIN pg_catalog.pg_class c ON c.oid = a.attrelid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
    "WHERE a.attnum > 0 AND NOT a.attisdropped AND ((n.nspname = pg_catalog.current_schema() "
    "AND c.relkind IN ('r', 'v', 'm', 'p', 'f')) OR (n.nspname = 'information_schema' AND c.relname IN ('tables', 'columns', 'views')))"
)
