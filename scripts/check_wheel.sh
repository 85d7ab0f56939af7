#!/usr/bin/env bash
# Build the wheel, install it in a fresh virtual environment (core dependencies only, no torch),
# and check that the console script and the packaged migrations work there.
set -euo pipefail
python=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work" build' EXIT  # setuptools leaves build/ in the tree; stale copies there mislead
"$python" -m pip wheel -q --no-deps -w "$work/dist" .
"$python" -m venv "$work/venv"
"$work/venv/bin/pip" install -q "$work"/dist/attnstore-*.whl
cd "$work"  # away from the source tree: only the installed package can be imported
"$work/venv/bin/attnstore" --help > /dev/null
"$work/venv/bin/python" -c "from attnstore.queries.engine.kernels import VERSIONS, kernel; [kernel(name) for name in VERSIONS]"  # the compiled reduces' one module, queries/_kernels.c, is in the wheel with every part
"$work/venv/bin/attnstore" db upgrade --db "sqlite:///$work/new.sqlite"
"$work/venv/bin/attnstore" db current --db "sqlite:///$work/new.sqlite" | grep -q "up to date"
"$work/venv/bin/attnstore" runs --db "sqlite:///$work/new.sqlite" --root "$work/z" > /dev/null
# without the ingest extra, ingest fails in one line naming it, before creating anything
printf 'a b\n' > "$work/c.txt"
if out=$("$work/venv/bin/attnstore" ingest --corpus "$work/c.txt" --format text --home "$work/h" 2>&1); then
  echo "wheel check: ingest without torch should have failed"; exit 1
fi
if [ "$(printf '%s\n' "$out" | wc -l)" -ne 1 ] || ! printf '%s' "$out" | grep -q "needs the 'ingest' extra" || [ -e "$work/h" ]; then
  echo "wheel check: ingest without torch should fail in one line naming the extra, creating nothing; got:"; echo "$out"; exit 1
fi
echo "wheel check: attnstore installs from its wheel; its compiled reduces load; --help, db upgrade, db current and runs work; ingest names its missing extra"
