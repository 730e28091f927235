#!/usr/bin/env bash
# Build one wheel that installs kvmtune and its netload binary (static, x86-64 Linux), into dist/.
# Hosts installed from it need no Go: `pip install dist/kvmtune-*.whl` (Ansible's role does this).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
make -s -C netload build
file netload/bin/netload 2>/dev/null | grep -q "statically linked" || {
  echo "build-wheel.sh: netload/bin/netload is not a static binary" >&2; exit 1; }
mkdir -p src/kvmtune/_bin
cp netload/bin/netload src/kvmtune/_bin/netload
trap 'rm -rf src/kvmtune/_bin build' EXIT
py=.venv/bin/python
[ -x "$py" ] || py=python3
out=${1:-dist}
mkdir -p "$out"
rm -f "$out"/kvmtune-*.whl
"$py" -m pip wheel -q --no-deps --no-build-isolation -w "$out" .
ls "$out"/kvmtune-*.whl
