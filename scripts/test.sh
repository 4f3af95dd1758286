#!/usr/bin/env bash
# The one test command (README, .ci/run): formatting, lints, docs, the
# dependency-direction check, every test (unit, property, integration, doc,
# end-to-end, store conformance on memory/SQLite/PostgreSQL) and the replay of
# the committed fuzz seed corpora. Works on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

# shellcheck source=scripts/pg.sh
source scripts/pg.sh

# The `smolbox shell` test drives the command through a real terminal (tmux).
if ! command -v tmux >/dev/null 2>&1; then
    echo "test: installing tmux"
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tmux >/dev/null
fi

# devworker/tests/diffworker.rs replays the real worker's recorded answers
# through tools/diffworker/diff.py (Python 3 standard library only).
if ! command -v python3 >/dev/null 2>&1; then
    echo "test: installing python3"
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 >/dev/null
fi

echo "test: cargo fmt --check"
cargo fmt --all -- --check

echo "test: clippy -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

echo "test: docs"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps -q

echo "test: dependency directions"
bash scripts/check-deps.sh

echo "test: no public type name twice in core"
python3 scripts/core-type-names.py

echo "test: every decision listed in docs/decisions.md"
python3 scripts/decisions-index.py

echo "test: cargo test (unit, property, integration, doc, fuzz seed replay)"
cargo test --workspace --no-fail-fast
