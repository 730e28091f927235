#!/usr/bin/env bash
# Run every test: lint, types, unit and integration tests (real QEMU under TCG, libvirtd,
# namespaces), and netload's Go tests. Installs what is missing first (idempotent).
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --deps-only || { echo "test.sh: install failed" >&2; exit 1; }
export PATH="$PATH:/usr/local/go/bin"
status=0
step() { echo "== $*"; "$@" || status=1; }
step .venv/bin/ruff check src tests bench tools
step .venv/bin/mypy
step .venv/bin/pytest -q -p no:cacheprovider tests
if [ -f netload/Makefile ]; then
  step make -s -C netload test
fi
if [ $status -ne 0 ]; then echo "test.sh: FAILED" >&2; fi
exit $status
