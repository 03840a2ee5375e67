#!/usr/bin/env bash
# The one test command: the README's second line and `.ci/run` call it (after
# `scripts/setup.sh --tests`). It runs every test of the workspace: with cargo-nextest
# (on this project's machines; `cargo install cargo-nextest --locked` elsewhere) each test
# in its own process, then the doc tests, then the ten slowest tests and one closing line;
# without nextest, plain `cargo test --workspace`.
#
# Usage: scripts/test.sh [nextest filters...]
set -euo pipefail
cd "$(dirname "$0")/.."

if ! cargo nextest --version >/dev/null 2>&1; then
    echo "test: cargo-nextest not found; running cargo test (no per-test times)" >&2
    exec cargo test --workspace "$@"
fi

log=$(mktemp)
trap 'rm -f "$log" "$log.doc"' EXIT
start=$(date +%s)
status=0
cargo nextest run --workspace --no-fail-fast "$@" 2>&1 | tee "$log" || status=$?
doc=0
cargo test --workspace --doc 2>&1 | tee "$log.doc" || doc=$?

echo
echo "The ten slowest tests:"
grep -E '^ +(PASS|FAIL|SIGSEGV|SIGABRT|TIMEOUT|LEAK)[^[]*\[ *[0-9.]+s\]' "$log" \
    | sed -E 's/^ +([A-Z-]+)[^[]*\[ *([0-9.]+)s\] (\( *[0-9]+\/[0-9]+\) )?/\2 \1 /' \
    | sort -rn | head -10 | awk '{ printf "  %8.1f s  %s", $1, $2; for (i = 3; i <= NF; i++) printf " %s", $i; print "" }'

count() { grep -oE "$1" "$2" | grep -oE '[0-9]+' | awk '{ s += $1 } END { print s + 0 }'; }
summary=$(grep -E '^ +Summary \[' "$log" | tail -1)
passed=$(echo "$summary" | grep -oE '[0-9]+ passed' | grep -oE '[0-9]+' || echo 0)
failed=$(echo "$summary" | grep -oE '[0-9]+ failed' | grep -oE '[0-9]+' || echo 0)
doc_passed=$(count '[0-9]+ passed;' "$log.doc")
doc_failed=$(count '[0-9]+ failed;' "$log.doc")
echo "$(( $(date +%s) - start )) s in all (building the tests included)"
echo "tests: $(( passed + doc_passed )) passed, $(( failed + doc_failed )) failed"
[ "$status" = 0 ] && [ "$doc" = 0 ]
