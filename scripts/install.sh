#!/usr/bin/env bash
# Install everything kvmtune needs on Debian 12 (as root), then run the main job:
# `kvmtune audit` of this host (it falls back to the bundled examples when the host has no guests).
#   --deps-only   install, do not run the audit (used by scripts/test.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
here=$(pwd)
run_audit=1
[ "${1:-}" = "--deps-only" ] && run_audit=0

if [ "$(id -u)" -ne 0 ]; then
  echo "install.sh: run as root (it installs Debian packages and starts libvirtd)" >&2
  exit 2
fi

# Debian packages: QEMU and qemu-img, libvirt (daemon, client, Python binding), the probe guest's
# parts (cloud kernel whose virtio drivers are modules, static busybox, fio, cpio/zstd/kmod to
# assemble it), Open vSwitch, namespaces and NAT (iproute2, nftables), sfdisk for partition tests,
# iperf3 and sockperf as yardsticks for netload; tmux (drives `kvmtune top` in its test) and
# prometheus (its promtool checks the textfile output of `kvmtune sample`).
PACKAGES=(
  qemu-system-x86 qemu-utils
  libvirt-daemon-system libvirt-clients python3-libvirt python3-lxml python3-venv
  fio linux-image-cloud-amd64 busybox-static cpio zstd lz4 kmod e2fsprogs
  openvswitch-switch iproute2 nftables fdisk iperf3 sockperf time
  tmux prometheus
)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install.sh: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# A virtualenv on Debian's Python, so it sees python3-libvirt; kvmtune and its tools from PyPI.
PY=/usr/bin/python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv --system-site-packages .venv
fi
stamp=.venv/.kvmtune-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/pip install -q --disable-pip-version-check -e ".[dev,report]"
  touch "$stamp"
fi

# The official SARIF 2.1.0 JSON schema, for the test that validates `--format sarif`
# (shipped in Microsoft's @microsoft/jest-sarif package on the npm registry).
schema=.venv/share/sarif/sarif-2.1.0-rtm.5.json
if [ ! -s "$schema" ] && command -v npm >/dev/null; then
  tmp=$(mktemp -d)
  if (cd "$tmp" && npm pack -q @microsoft/jest-sarif@1.0.0-beta.0 >/dev/null 2>&1); then
    mkdir -p "$(dirname "$schema")"
    tar -xzf "$tmp"/microsoft-jest-sarif-*.tgz -C "$tmp" package/lib/schemas/sarif-2.1.0-rtm.5.json
    mv "$tmp/package/lib/schemas/sarif-2.1.0-rtm.5.json" "$schema"
  else
    echo "install.sh: could not fetch the SARIF schema from npm; the SARIF schema test will fail" >&2
  fi
  rm -rf "$tmp"
fi

# netload, the in-guest network load generator (Go, standard library only).
export PATH="$PATH:/usr/local/go/bin"
if [ -f netload/Makefile ]; then
  if command -v go >/dev/null; then
    make -s -C netload build
  else
    echo "install.sh: Go is not installed; netload not built (apt-get install golang-go)" >&2
  fi
fi

# libvirtd without systemd: started by hand, as the project's own script does it.
bash scripts/services.sh libvirtd-start

if [ "$run_audit" -eq 1 ]; then
  echo "install.sh: done. Running the main job: kvmtune audit"
  "$here/.venv/bin/kvmtune" audit
fi
