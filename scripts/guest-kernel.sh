#!/usr/bin/env bash
# A generic Debian kernel for the probe guest, unpacked into kvmtune's cache, never into /boot.
#
# The probe guest boots the host's newest /boot/vmlinuz-* by default. On a hypervisor that is often
# Debian's cloud kernel, which has no e1000/e1000e/8139cp/8139too/ahci drivers, so the guest tier of
# `kvmtune verify` cannot boot the "as it is" side of an emulated NIC or a SATA disk with it. This
# script fetches the generic flavour's package with `apt-get download` (nothing is installed), unpacks
# it with `dpkg-deb -x` below CACHE/RELEASE/ and runs `depmod -b` there; verify picks it up by itself.
#
#   scripts/guest-kernel.sh [--cache DIR] [--package linux-image-X-amd64]
#
# Which package: the generic flavour of /boot's newest kernel ABI (6.1.0-56-cloud-amd64 →
# linux-image-6.1.0-56-amd64) when the archive has it, else what linux-image-amd64 depends on.
# Idempotent (a release already unpacked is left as it is) and offline-tolerant: when apt cannot
# give the package it says so in one line and exits 3, changing nothing.
# Environment: KVMTUNE_GUEST_KERNEL_CACHE (default /var/cache/kvmtune/guest-kernel), KVMTUNE_BOOT_DIR
# (where the host's kernels are, default /boot: for the test).
set -euo pipefail
cache=${KVMTUNE_GUEST_KERNEL_CACHE:-/var/cache/kvmtune/guest-kernel}
boot=${KVMTUNE_BOOT_DIR:-/boot}
package=
while [ $# -gt 0 ]; do
  case "$1" in
    --cache) cache=${2:?--cache needs a directory}; shift 2 ;;
    --package) package=${2:?--package needs a package name}; shift 2 ;;
    *) echo "usage: $0 [--cache DIR] [--package linux-image-RELEASE]" >&2; exit 2 ;;
  esac
done
for tool in apt-get apt-cache dpkg-deb depmod; do
  command -v "$tool" >/dev/null || { echo "guest-kernel.sh: $tool is not installed (a Debian host is needed)" >&2; exit 2; }
done

known() { apt-cache show --no-all-versions "$1" >/dev/null 2>&1; }

if [ -z "$package" ]; then
  newest=$(ls "$boot"/vmlinuz-* 2>/dev/null | grep -v '\.old$' | sed 's|.*/vmlinuz-||' | sort -V | tail -1 || true)
  abi=$(printf '%s\n' "$newest" | sed -nE 's/^([0-9]+\.[0-9]+\.[0-9]+-[0-9]+)-.*$/\1/p')
  arch=$(printf '%s\n' "$newest" | sed -nE 's/^.*-([a-z0-9_]+)$/\1/p')
  if [ -n "$abi" ] && known "linux-image-$abi-${arch:-amd64}"; then
    package="linux-image-$abi-${arch:-amd64}"
  else
    package=$(apt-cache depends linux-image-amd64 2>/dev/null | sed -nE 's/^ *Depends: (linux-image-[^ ]+)$/\1/p' | head -1 || true)
  fi
  if [ -z "$package" ]; then
    echo "guest-kernel.sh: apt knows no generic kernel package (neither linux-image-${abi:-?}-${arch:-amd64}" \
         "nor linux-image-amd64's dependency: offline, or no 'apt-get update' yet); nothing fetched, the probe guest" \
         "keeps $boot's kernel" >&2
    exit 3
  fi
fi
case "$package" in
  linux-image-*) ;;
  *) echo "guest-kernel.sh: $package is not a linux-image-* package" >&2; exit 2 ;;
esac
release=${package#linux-image-}
release=${release%-unsigned}
dest=$cache/$release
if [ -f "$dest/boot/vmlinuz-$release" ] && [ -f "$dest/lib/modules/$release/modules.dep" ]; then
  echo "guest-kernel.sh: $release is already in $dest"
  exit 0
fi

mkdir -p "$cache"
tmp=$(mktemp -d "$cache/.partial-XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM
# apt's _apt user must be able to write the download directory (else it warns and runs unsandboxed)
chmod 755 "$tmp"
if ! (cd "$tmp" && apt-get download -q "$package" >"$tmp/apt.log" 2>&1); then
  echo "guest-kernel.sh: apt-get download $package failed ($(grep -E '^(E|W):' "$tmp/apt.log" | head -1 | cut -c1-160)):" \
       "offline or not in the archive; nothing changed, the probe guest keeps $boot's kernel" >&2
  exit 3
fi
deb=$(ls "$tmp"/*.deb)
dpkg-deb -x "$deb" "$tmp/root"
rm -f "$deb"
# trixie's packages put the modules below /usr/lib/modules: one place for depmod -b and for kvmtune
if [ ! -d "$tmp/root/lib/modules/$release" ] && [ -d "$tmp/root/usr/lib/modules/$release" ]; then
  mkdir -p "$tmp/root/lib/modules"
  mv "$tmp/root/usr/lib/modules/$release" "$tmp/root/lib/modules/$release"
fi
mods=$tmp/root/lib/modules/$release
if [ ! -f "$tmp/root/boot/vmlinuz-$release" ] || [ ! -d "$mods" ]; then
  echo "guest-kernel.sh: $package has no boot/vmlinuz-$release or no module tree; nothing changed" >&2
  exit 1
fi
# what a probe guest never loads (graphics, sound, wireless, cameras, InfiniBand): about 150 MB less
for d in kernel/drivers/gpu kernel/drivers/media kernel/drivers/net/wireless kernel/drivers/infiniband \
         kernel/drivers/staging kernel/sound; do
  rm -rf "${mods:?}/$d"
done
rm -rf "$tmp/root/usr/share"
depmod -b "$tmp/root" "$release"
rm -rf "$dest"
mv "$tmp/root" "$dest"
echo "guest-kernel.sh: $release unpacked into $dest ($(du -sm "$dest" | cut -f1) MB); kvmtune verify's guest tier uses it"
