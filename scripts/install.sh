#!/usr/bin/env bash
# Install what kvmtune needs on Debian 12 (bookworm) or 13 (trixie, and Proxmox VE 9 on it) (as root), then run the main job: `kvmtune audit` of
# this host, then the example domains shipped with kvmtune, each under its own heading.
#   (no option)   everything: auditing, fixing, benchmarks and the tests. On a hypervisor this
#                 installs a second kernel package (linux-image-cloud-amd64, the probe guest's),
#                 Open vSwitch, iperf3 and sockperf, builds netload with Go, fetches the SARIF
#                 schema from npm and starts libvirtd; unpacks a generic Debian kernel for verify's
#                 guest tier into /var/cache/kvmtune (scripts/guest-kernel.sh). Links /usr/local/bin/kvmtune.
#   --audit-only  for production hosts: only what `kvmtune audit` and `kvmtune fix` need
#                 (python3-venv, python3-lxml, python3-libvirt, qemu-utils); no kernel, no OVS,
#                 no benchmark tools, no Go, no npm, nothing from PyPI, starts nothing.
#                 Links /usr/local/bin/kvmtune.
#   --deps-only   everything, no audit and no /usr/local/bin link (used by scripts/test.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
here=$(pwd)
mode=${1:-full}
case "$mode" in
  full|--deps-only|--audit-only) ;;
  *) echo "usage: $0 [--audit-only|--deps-only]" >&2; exit 2 ;;
esac

# Which Debian: the package lists below are bookworm's and trixie's. Anything else is refused before anything
# is installed, with one line that names what to install by hand (or the .deb and the wheel, which need no checkout).
os_release=${KVMTUNE_OS_RELEASE:-/etc/os-release}  # overridable for the install test
release=$( . "$os_release" 2>/dev/null || true; echo "${ID:-unknown} ${VERSION_CODENAME:-${VERSION_ID:-release}}")
case "$release" in
  "debian bookworm"|"debian trixie") ;;
  *) echo "install.sh: $release is not Debian 12 (bookworm) or 13 (trixie); nothing installed. Install by hand:" \
       "python3 (>= 3.11) with venv, lxml, libvirt's Python binding and qemu-img, then 'pip install kvmtune-*.whl'" \
       "(scripts/build-wheel.sh), or 'apt install --no-install-recommends ./dist/kvmtune_*.deb' (scripts/build-deb.sh dist) on a Debian-based release" >&2
     exit 2 ;;
esac
# bookworm and trixie name every package below alike (each checked with apt-cache policy in a debootstrapped
# trixie); what differs is what they bring: trixie's Python 3.13, QEMU 10, libvirt 11.

if [ "$(id -u)" -ne 0 ]; then
  echo "install.sh: run as root (it installs Debian packages and starts libvirtd)" >&2
  exit 2
fi

# Debian packages: QEMU and qemu-img, libvirt (daemon, client, Python binding), the probe guest's
# parts (cloud kernel whose virtio drivers are modules, static busybox, fio, cpio/zstd/kmod to
# assemble it), Open vSwitch, namespaces and NAT (iproute2, nftables), sfdisk for partition tests,
# iperf3 and sockperf as yardsticks for netload; tmux (drives `kvmtune top` in its test) and
# prometheus (its promtool checks the textfile output of `kvmtune sample`); the block tier's
# qemu-storage-daemon (qemu-system-common), the file systems of `--host-fs` (xfsprogs, btrfs-progs, lvm2)
# and qemu-guest-agent (never run on the host: its binary and libraries go into the probe guest);
# fish (its completion's test), debootstrap and lintian (the .deb's proof in a clean bookworm and trixie,
# scripts/deb-proof.sh), blktrace (its blkparse reads the records of capture --source blktrace's test).
# Python 3.12 and 3.13 for the wheel's test are not Debian 12 packages: pyenv's where
# the machine has them; trixie's python3.13 runs the unit tests in the proof's chroot otherwise.
PACKAGES=(
  qemu-system-x86 qemu-utils
  libvirt-daemon-system libvirt-clients python3-libvirt python3-lxml python3-yaml python3-venv
  fio linux-image-cloud-amd64 busybox-static cpio zstd lz4 kmod e2fsprogs
  openvswitch-switch iproute2 nftables fdisk iperf3 sockperf time
  tmux prometheus openssh-server ansible-core zsh groff-base chromium
  qemu-system-common xfsprogs btrfs-progs lvm2 qemu-guest-agent
  fish debootstrap lintian blktrace
)
# Audit-only: read domain XML, KubeVirt manifests (python3-yaml), libvirt (read-only) and disk images; nothing that runs or changes the host.
[ "$mode" = "--audit-only" ] && PACKAGES=(python3-venv python3-lxml python3-yaml python3-libvirt qemu-utils)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install.sh: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  # openssh-server's (and prometheus') postinst would start a daemon listening on every address
  # of this hypervisor; kvmtune only runs its own sshd inside test namespaces. Deny service starts
  # for this install only, unless the host already has a policy of its own.
  own_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && own_policy=1
  fi
  apt-get install -y -q --no-install-recommends "${missing[@]}" || { [ $own_policy = 1 ] && rm -f /usr/sbin/policy-rc.d; exit 1; }
  [ $own_policy = 1 ] && rm -f /usr/sbin/policy-rc.d
fi

# A virtualenv on Debian's Python, so it sees python3-libvirt; kvmtune and its tools from PyPI.
PY=/usr/bin/python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv --system-site-packages .venv
fi
stamp=.venv/.kvmtune-installed
if [ "$mode" = "--audit-only" ]; then
  # nothing from PyPI: lxml is Debian's, and the venv's own setuptools builds kvmtune
  [ -x .venv/bin/kvmtune ] || .venv/bin/pip install -q --disable-pip-version-check --no-index --no-build-isolation -e .
elif [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/pip install -q --disable-pip-version-check -e ".[dev,report]"
  touch "$stamp"
fi
# The unit tests run on Python 3.13 too (scripts/test.sh): Debian 12 has no 3.13, so pyenv's, where this machine
# has one (this project's machines do); without it test.sh says the 3.13 unit tier was not run.
py313=$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.13.*/bin/python3.13 2>/dev/null | sort -V | tail -1 || true)
if [ "$mode" != "--audit-only" ] && [ -n "$py313" ]; then
  if [ ! -x .venv-py313/bin/python ] || [ pyproject.toml -nt .venv-py313/.kvmtune-installed ]; then
    "$py313" -m venv .venv-py313
    .venv-py313/bin/pip install -q --disable-pip-version-check -e ".[dev]" && touch .venv-py313/.kvmtune-installed
  fi
fi

# The command on PATH: a link to this checkout's .venv/bin/kvmtune (an existing other kvmtune is left alone).
link=${KVMTUNE_BIN_LINK:-/usr/local/bin/kvmtune}  # overridable for the install test
ours=$here/.venv/bin/kvmtune
if [ "$mode" != "--deps-only" ]; then
  free=0
  if [ -L "$link" ]; then
    { [ "$(readlink "$link")" = "$ours" ] || [ ! -e "$link" ]; } && free=1  # ours, or dangling
  elif [ ! -e "$link" ]; then
    free=1
  fi
  if [ "$free" -eq 1 ]; then
    ln -sfn "$ours" "$link"
    echo "install.sh: kvmtune is on PATH: $link -> $ours"
  else
    echo "install.sh: $link exists and is not this checkout's; run $here/.venv/bin/kvmtune" >&2
  fi
fi

audit() {
  echo "== kvmtune audit: this host"
  status=0
  "$here/.venv/bin/kvmtune" audit || status=$?
  echo
  echo "== kvmtune audit --examples: the example domains shipped with kvmtune (not this host)"
  "$here/.venv/bin/kvmtune" audit --examples --no-images || true
  return $status
}
if [ "$mode" = "--audit-only" ]; then
  echo "install.sh: audit-only install done. Running the main job."
  audit
  exit $?
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

if [ -s "$schema" ] && [ -x .venv-py313/bin/python ]; then  # the 3.13 unit tier validates SARIF too
  mkdir -p .venv-py313/share/sarif && cp "$schema" .venv-py313/share/sarif/
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

# A generic Debian kernel for the probe guest (the cloud kernel above has no e1000, rtl8139 or AHCI driver),
# unpacked into /var/cache/kvmtune/guest-kernel, not installed: verify's guest tier boots emulated NICs and SATA with it.
bash scripts/guest-kernel.sh || echo "install.sh: no generic guest kernel; verify's guest tier will say which sides it cannot boot" >&2

# libvirtd without systemd: started by hand, as the project's own script does it.
bash scripts/services.sh libvirtd-start

if [ "$mode" = "full" ]; then
  echo "install.sh: done. Running the main job."
  audit
fi
