#!/usr/bin/env bash
# Build the wheel, install it in a fresh virtual environment (core dependencies only, no torch),
# and check that the console script and the packaged migrations work there.
set -euo pipefail
python=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" -m pip wheel -q --no-deps -w "$work/dist" .
"$python" -m venv "$work/venv"
"$work/venv/bin/pip" install -q "$work"/dist/attnstore-*.whl
cd "$work"  # away from the source tree: only the installed package can be imported
"$work/venv/bin/attnstore" --help > /dev/null
"$work/venv/bin/attnstore" db upgrade --db "sqlite:///$work/new.sqlite"
"$work/venv/bin/attnstore" db current --db "sqlite:///$work/new.sqlite" | grep -q "up to date"
"$work/venv/bin/attnstore" runs --db "sqlite:///$work/new.sqlite" --root "$work/z" > /dev/null
echo "wheel check: attnstore installs from its wheel; --help, db upgrade, db current and runs work"
