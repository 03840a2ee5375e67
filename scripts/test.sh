#!/usr/bin/env bash
# The one test command: the README's second line and `.ci/run` call it (after
# `scripts/setup.sh --tests`). It runs every test of the workspace: with cargo-nextest
# (on this project's machines; `cargo install cargo-nextest --locked` elsewhere) each test
# in its own process, then the doc tests, then the Python tests (pytest, in the venv
# `scripts/setup.sh --tests` makes), then the ten slowest Rust tests and one closing line;
# without nextest, plain `cargo test --workspace` and then the Python tests.
#
# `.config/nextest.toml`'s default filter leaves out the slowest Rust tests (large ILPs);
# --slow runs them too.
#
# Usage: scripts/test.sh [--slow] [nextest filters...]
set -euo pipefail
cd "$(dirname "$0")/.."

slow=()
if [ "${1:-}" = --slow ]; then
    slow=(--ignore-default-filter)
    shift
fi

log=$(mktemp)
trap 'rm -f "$log" "$log.doc" "$log.venv" "$log.py"' EXIT

# The Python tests (pebble._core's, pebble.torch's against eager PyTorch), in the venv
# `scripts/setup.sh --tests` made; the package is rebuilt first (incremental). Sets `py`.
python_tests() {
    py=0
    if scripts/py-venv.sh --torch >"$log.venv" 2>&1; then
        target/torch-venv/bin/python -m pytest crates/python/tests_core crates/python/tests -q -rsx \
            -p no:cacheprovider 2>&1 | tee "$log.py" || py=$?
    else
        cat "$log.venv"
        echo "test: the Python package did not build (above); run scripts/setup.sh --tests" | tee "$log.py"
        py=1
    fi
}

if ! cargo nextest --version >/dev/null 2>&1; then
    echo "test: cargo-nextest not found; running cargo test (no per-test times)" >&2
    rust=0
    cargo test --workspace "$@" || rust=$?
    python_tests
    [ "$rust" = 0 ] && [ "$py" = 0 ]
    exit
fi

start=$(date +%s)
status=0
cargo nextest run --workspace --no-fail-fast ${slow[@]+"${slow[@]}"} "$@" 2>&1 | tee "$log" || status=$?
doc=0
cargo test --workspace --doc 2>&1 | tee "$log.doc" || doc=$?
rust_end=$(date +%s)
python_tests

echo
echo "The ten slowest tests:"
# `sed -n` reads all of sort's output: `head` would close the pipe early, and with more
# than a pipe's buffer of lines sort dies of SIGPIPE, which pipefail makes the script's
# exit status (141, after every test had passed).
grep -E '^ +(PASS|FAIL|SIGSEGV|SIGABRT|TIMEOUT|LEAK)[^[]*\[ *[0-9.]+s\]' "$log" \
    | sed -E 's/^ +([A-Z-]+)[^[]*\[ *([0-9.]+)s\] (\( *[0-9]+\/[0-9]+\) )?/\2 \1 /' \
    | sort -rn | sed -n '1,10p' | awk '{ printf "  %8.1f s  %s", $1, $2; for (i = 3; i <= NF; i++) printf " %s", $i; print "" }'

count() { { grep -oE "$1" "$2" || true; } | { grep -oE '[0-9]+' || true; } | awk '{ s += $1 } END { print s + 0 }'; }
summary=$(grep -E '^ +Summary \[' "$log" | tail -1)
passed=$(echo "$summary" | grep -oE '[0-9]+ passed' | grep -oE '[0-9]+' || echo 0)
failed=$(echo "$summary" | grep -oE '[0-9]+ failed' | grep -oE '[0-9]+' || echo 0)
doc_passed=$(count '[0-9]+ passed;' "$log.doc")
doc_failed=$(count '[0-9]+ failed;' "$log.doc")
py_summary=$(grep -E '^[=]* *[0-9]+ (passed|failed)|^[=]* *[0-9]+ [a-z]+.* in [0-9.]+s' "$log.py" | tail -1 || true)
py_passed=$(echo "$py_summary" | grep -oE '[0-9]+ passed' | grep -oE '[0-9]+' || echo 0)
py_failed=$(echo "$py_summary" | { grep -oE '[0-9]+ (failed|error)' || true; } | grep -oE '[0-9]+' \
    | awk '{ s += $1 } END { print s + 0 }' || true)
py_failed=${py_failed:-0}
[ "$py" = 0 ] || [ "$py_failed" -gt 0 ] || py_failed=1
echo "$(( rust_end - start )) s for the Rust tests (building them included), $(( $(date +%s) - rust_end )) s for the Python tests, $(( $(date +%s) - start )) s in all"
echo "tests: $(( passed + doc_passed + py_passed )) passed, $(( failed + doc_failed + py_failed )) failed"
[ "$status" = 0 ] && [ "$doc" = 0 ] && [ "$py" = 0 ]
