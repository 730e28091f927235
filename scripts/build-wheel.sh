#!/usr/bin/env bash
# Build kvmtune's distributions into OUTDIR (default dist/):
#   kvmtune-V-py3-none-manylinux2014_x86_64.whl  with the static x86-64 netload inside (any Python 3.11+, any
#                                                glibc x86-64 Linux: hosts installed from it need no Go)
#   kvmtune-V-py3-none-any.whl                   pure Python, for other architectures: no netload (`kvmtune doctor` says so)
#   kvmtune-V.tar.gz                             the sdist (Python package and netload's Go source)
# Each carries src/kvmtune/_build.json, stamped here: the version, the commit, and netload's version (or none),
# which `kvmtune --version` prints. `pip install OUTDIR/kvmtune-*.whl` picks the right wheel for the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
out=${1:-dist}
mkdir -p "$out"
out=$(cd "$out" && pwd)
GOARCH=amd64 make -s -C netload build
file netload/bin/netload 2>/dev/null | grep -q "statically linked" || {
  echo "build-wheel.sh: netload/bin/netload is not a static binary" >&2; exit 1; }
netload_version=$(netload/bin/netload version | awk '{print $2}')
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml)
commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
if [ "$commit" != unknown ] && [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  commit="$commit-dirty"
fi
stamp() {  # stamp NETLOAD_VERSION_JSON
  printf '{"version": "%s", "commit": "%s", "netload": %s}\n' "$version" "$commit" "$1" > src/kvmtune/_build.json
}
trap 'rm -rf src/kvmtune/_bin src/kvmtune/_build.json build src/kvmtune.egg-info' EXIT
py=.venv/bin/python
[ -x "$py" ] || py=python3
rm -f "$out"/kvmtune-*.whl "$out"/kvmtune-*.tar.gz
wheel() {
  rm -rf build src/kvmtune.egg-info  # setuptools reuses build/lib: a stale netload would leak into the pure wheel
  "$py" -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation -w "$out" .
}
mkdir -p src/kvmtune/_bin
cp netload/bin/netload src/kvmtune/_bin/netload
stamp "\"$netload_version\""
wheel
rm -rf src/kvmtune/_bin
stamp null
wheel
"$py" -c 'import sys; from setuptools import build_meta; build_meta.build_sdist(sys.argv[1])' "$out" >/dev/null
ls "$out"/kvmtune-*.whl "$out"/kvmtune-*.tar.gz
