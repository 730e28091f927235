#!/usr/bin/env bash
# Run every test: lint, types, unit and integration tests (real QEMU under TCG, libvirtd,
# namespaces), and netload's Go tests. Installs what is missing first (idempotent). The integration
# tests and the unit tiers (3.11, 3.13, Go) run side by side, one lane per core.
#   --fast   the development loop: ruff, mypy and the unit tier (pytest -m "not integration"),
#            with the .venv already there (no install.sh, no integration tests, no Go tests)
set -uo pipefail
cd "$(dirname "$0")/.."
fast=0
case "${1:-}" in
  "") ;;
  --fast) fast=1 ;;
  *) echo "usage: $0 [--fast]" >&2; exit 2 ;;
esac
if [ $fast -eq 1 ]; then
  for tool in python ruff mypy pytest; do
    if [ ! -x ".venv/bin/$tool" ]; then
      echo "test.sh: .venv/bin/$tool is missing: run 'bash scripts/install.sh' once (test.sh --fast never installs)" >&2
      exit 1
    fi
  done
else
  bash scripts/install.sh --deps-only || { echo "test.sh: install failed" >&2; exit 1; }
fi
# this checkout's code, even where .venv is shared with another checkout (a git worktree)
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$PATH:/usr/local/go/bin"
status=0
step() {
  local start=$SECONDS
  echo "== $*"
  "$@" || status=1
  echo "== $(( SECONDS - start )) s: $1"
}
step .venv/bin/ruff check src tests bench tools
step .venv/bin/mypy
if [ $fast -eq 1 ]; then
  step .venv/bin/pytest -q -p no:cacheprovider -m "not integration" tests
else
  # Two lanes side by side, one per core (CI's machine has two): lane A runs what starts real services
  # (integration tests, then verify's guest tier in its own step); lane B, at the lowest priority (nice 19) so that lane A's
  # guests and services come first, runs the unit tier on Python 3.11 and 3.13 and netload's Go tests. Lane B's
  # output is printed after lane A's, in one piece.
  lane_b_log=$(mktemp)
  (
    renice -n 19 -p $BASHPID >/dev/null 2>&1 || true  # absolute: also when the caller is niced already
    status=0
    step .venv/bin/pytest -q -p no:cacheprovider -p no:randomly -m "not integration and not guest_tier" tests
    if [ -x .venv-py313/bin/pytest ]; then  # the unit tier on Python 3.13 as well (install.sh makes .venv-py313)
      # not here: the two tests that run this interpreter as 'nobody' (pyenv's lives under root's 0700 home), and
      # the one that needs Debian's python3-libvirt (built for Debian's 3.11 only)
      step .venv-py313/bin/pytest -q -p no:cacheprovider -p no:randomly -m "not integration and not guest_tier" tests \
        --deselect tests/audit/test_bad_input.py::test_unreadable_file \
        --deselect tests/security/test_hostile_inputs.py::test_unreadable_directory_as_nobody \
        --deselect "tests/fix/test_fix_failures.py::test_bad_arguments[argv7-cannot connect to libvirt]"
    else
      echo "== Python 3.13 unit tier not run: no .venv-py313 (install.sh makes it where pyenv has a 3.13)"
    fi
    if [ -f netload/Makefile ]; then
      step make -s -C netload test
    fi
    exit $status
  ) > "$lane_b_log" 2>&1 &
  lane_b=$!
  lane_start=$SECONDS
  step .venv/bin/pytest -q -p no:cacheprovider -p no:randomly -m "integration and not guest_tier" tests
  # verify's guest tier end to end (two probe guests, under TCG here): its own step, held to 180 s
  step timeout --kill-after=10 180 .venv/bin/pytest -q -p no:cacheprovider -p no:randomly -m guest_tier tests/verify
  wait $lane_b || status=1
  echo "== lane B (unit tiers on 3.11 and 3.13, Go), run beside the above:"
  cat "$lane_b_log"
  rm -f "$lane_b_log"
  echo "== $(( SECONDS - lane_start )) s: both lanes"
fi
if [ $status -ne 0 ]; then echo "test.sh: FAILED" >&2; fi
exit $status
