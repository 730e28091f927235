#!/usr/bin/env bash
# The .deb in a clean Debian system: SUITE is trixie (Debian 13) or bookworm (Debian 12).
#   bash scripts/deb-proof.sh SUITE [DEB]    (as root; DEB defaults to one built now by scripts/build-deb.sh)
# Debootstraps a minimal SUITE (cached as a tarball in $KVMTUNE_PROOF_CACHE, default /var/cache/kvmtune-proof, so
# the next run only unpacks it; a fresh machine builds it from Debian's mirror), installs kvmtune's dependencies
# and then the package with the README's own `apt install --no-install-recommends ./dist/kvmtune_*.deb` line, read
# from README.md and run as written, so they resolve from SUITE (trixie: Python
# 3.13, QEMU 10, libvirt 11), and inside the chroot runs: kvmtune --version, audit --examples, audit --host (the
# chroot sees THIS machine's /proc and /sys, so the host audit is of the machine running the proof), rules
# explain, man kvmtune, the bash/zsh/fish completions, systemd-analyze verify of the units, kvmtune config show (it
# reads the shipped /etc/kvmtune/kvmtune.toml, every key commented out), and the services' own
# ExecStart lines (their textfiles are checked with promtool when promtool is here). Then `systemctl enable` of both
# timers, `apt-get purge kvmtune` and a file-by-file comparison with the system before the package: nothing of
# kvmtune may be left (no enable link in timers.target.wants, no deb-systemd-helper state).
# Everything is unmounted and the chroot removed on every exit path; only the cache stays.
set -euo pipefail
cd "$(dirname "$0")/.."
suite=${1:-}
case "$suite" in
  trixie|bookworm) ;;
  *) echo "usage: $0 trixie|bookworm [DEB]" >&2; exit 2 ;;
esac
[ "$(id -u)" -eq 0 ] || { echo "deb-proof.sh: run as root (debootstrap, chroot, mounts)" >&2; exit 2; }
for tool in debootstrap chroot dpkg-deb; do
  command -v "$tool" >/dev/null || { echo "deb-proof.sh: $tool is missing (scripts/install.sh installs it)" >&2; exit 2; }
done
cache=${KVMTUNE_PROOF_CACHE:-/var/cache/kvmtune-proof}
mirror=${KVMTUNE_PROOF_MIRROR:-http://deb.debian.org/debian}
work=$(mktemp -d /var/tmp/kvmtune-proof.XXXXXX)
root=$work/root
mounted=()
cleanup() {
  local i
  for (( i=${#mounted[@]}-1; i>=0; i-- )); do umount -R "${mounted[$i]}" 2>/dev/null || umount -lR "${mounted[$i]}" || true; done
  if grep -q " $work/" /proc/mounts; then echo "deb-proof.sh: still mounted under $work; not removed" >&2; return; fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 143' TERM INT  # a timeout or Ctrl-C still unmounts and removes the chroot
t0=$SECONDS
step() { echo "== [$suite $(( SECONDS - t0 )) s] $*"; }

deb=${2:-}
if [ -z "$deb" ]; then
  step "build the package"
  bash scripts/build-deb.sh "$work/dist" >/dev/null
  deb=$(echo "$work"/dist/kvmtune_*.deb)
fi
[ -f "$deb" ] || { echo "deb-proof.sh: $deb: no such package" >&2; exit 2; }

# the base: minbase plus what the proof itself uses (systemd for systemd-analyze, man-db, the three shells)
tools=systemd,man-db,bash-completion,zsh,fish
base=$cache/$suite-base.tar
mkdir -p "$cache/$suite-archives/partial"
exec 9>"$cache/$suite.lock"
flock 9  # one proof of a suite at a time on this machine: they share the base image and the apt archive
if [ ! -s "$base" ] || [ "$(cat "$base.tools" 2>/dev/null)" != "$tools" ]; then
  step "debootstrap a minimal $suite (first run on this machine; cached in $base)"
  debootstrap --variant=minbase --include="$tools" "$suite" "$work/fresh" "$mirror" >"$work/debootstrap.log" 2>&1 || {
    tail -20 "$work/debootstrap.log" >&2; echo "deb-proof.sh: debootstrap of $suite failed" >&2; exit 1; }
  rm -rf "$work/fresh/var/cache/apt/archives"/*.deb
  tar -C "$work/fresh" -cf "$base.tmp" . && mv "$base.tmp" "$base" && echo "$tools" > "$base.tools"
  rm -rf "$work/fresh"
fi
step "unpack the cached $suite base"
mkdir -p "$root"
tar -C "$root" -xf "$base"
mount -t proc proc "$root/proc" && mounted+=("$root/proc")
mount --rbind /sys "$root/sys" && mount --make-rslave "$root/sys" && mounted+=("$root/sys")
mount --rbind /dev "$root/dev" && mount --make-rslave "$root/dev" && mounted+=("$root/dev")
mount --bind "$cache/$suite-archives" "$root/var/cache/apt/archives" && mounted+=("$root/var/cache/apt/archives")
cp /etc/resolv.conf "$root/etc/resolv.conf"
printf '#!/bin/sh\nexit 101\n' > "$root/usr/sbin/policy-rc.d" && chmod 755 "$root/usr/sbin/policy-rc.d"
printf 'APT::Get::Assume-Yes "true";\n' > "$root/etc/apt/apt.conf.d/90proof-assume-yes"  # the README's line has no -y
in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp/home LANG=C.UTF-8 \
  DEBIAN_FRONTEND=noninteractive "$@"; }
mkdir -p "$root/tmp/home"

step "apt-get update; install kvmtune's dependencies from $suite"
in_root apt-get update -q >/dev/null
deps=$(dpkg-deb -f "$deb" Depends | sed 's/([^)]*)//g; s/,/ /g')
in_root apt-get install -y -q --no-install-recommends $deps >/dev/null
echo "   $(in_root python3 --version), $(in_root dpkg-query -W -f='qemu-utils ${Version}, ' qemu-utils)$(in_root dpkg-query -W -f='python3-libvirt ${Version}' python3-libvirt)"
snapshot() {  # every path outside the churn of apt, dpkg, logs and /tmp, with its type
  (cd "$root" && find . -xdev \( -path ./proc -o -path ./sys -o -path ./dev -o -path ./tmp -o -path ./var/log \
     -o -path ./var/lib/apt -o -path ./var/lib/dpkg -o -path ./var/cache/apt -o -path ./var/cache/debconf \
     -o -path ./var/cache/man -o -path ./run \) -prune -o -printf '%y %p\n' | LC_ALL=C sort)
}
snapshot > "$work/before"

# the README's install line, as written (comment aside), run where the build put the package: /tmp/dist
readme_line=$(sed -n 's/^\(apt install [^#]*\)#.*/\1/p; s/^\(apt install [^#]*\)$/\1/p' README.md | head -1 | sed 's/ *$//')
case "$readme_line" in
  *--no-install-recommends*./dist/kvmtune_*.deb) ;;
  *) echo "deb-proof.sh: the README's first apt line is '$readme_line', not an --no-install-recommends of ./dist/kvmtune_*.deb" >&2; exit 1 ;;
esac
mkdir -p "$root/tmp/dist" && cp "$deb" "$root/tmp/dist/"
step "$readme_line (the README's line, in /tmp; apt answers yes by apt.conf, as a person would)"
in_root sh -c "cd /tmp && $readme_line" >/dev/null 2>"$work/apt.err" || {
  cat "$work/apt.err" >&2; exit 1; }
in_root kvmtune --version
step "kvmtune audit --examples"
in_root kvmtune audit --examples --no-images --color never | tail -3
step "kvmtune audit --host (this machine's /proc and /sys, seen from the chroot)"
rc=0; in_root kvmtune audit --host --color never > "$work/host.txt" || rc=$?
[ "$rc" -le 1 ] || { cat "$work/host.txt"; echo "deb-proof.sh: audit --host exited $rc" >&2; exit 1; }
tail -2 "$work/host.txt"
step "kvmtune rules explain KVM-STO-004"
in_root kvmtune rules explain KVM-STO-004 | head -2
step "man kvmtune"
in_root env MANWIDTH=80 man -P cat kvmtune > "$work/man.txt" 2>"$work/man.err"
grep -q "kvmtune audit" "$work/man.txt" || { cat "$work/man.err" >&2; echo "deb-proof.sh: man kvmtune shows no page" >&2; exit 1; }
head -1 "$work/man.txt"
step "completions: bash, zsh, fish"
in_root bash -c 'source /usr/share/bash-completion/bash_completion; _completion_loader kvmtune;
  COMP_WORDS=(kvmtune au); COMP_CWORD=1; _kvmtune; [ "${COMPREPLY[*]}" = audit ] && echo "   bash: kvmtune au -> ${COMPREPLY[*]}"'
in_root zsh -n /usr/share/zsh/vendor-completions/_kvmtune && echo "   zsh: _kvmtune parses ($(in_root zsh -c 'print -l $fpath' | grep -c vendor-completions) vendor-completions dir on fpath)"
got=$(in_root fish -c 'complete -C "kvmtune au"' | cut -f1)
[ "$got" = audit ] || { echo "deb-proof.sh: fish did not complete 'kvmtune au' (got: $got)" >&2; exit 1; }
echo "   fish: kvmtune au -> $got (from vendor_completions.d, no sourcing)"
units=(kvmtune-audit.service kvmtune-audit.timer kvmtune-sample.service kvmtune-sample.timer
       kvmtune-canary.service kvmtune-canary.timer kvmtune-canary-boot.service)
step "systemd-analyze verify ${units[*]}"
in_root systemd-analyze verify "${units[@]/#//usr/lib/systemd/system/}"
echo "   verified"
mkdir -p "$root/var/lib/kvmtune" "$root/var/cache/kvmtune"
step "kvmtune config show, as the services run it: it reads /etc/kvmtune/kvmtune.toml (every key commented: defaults)"
env_line=$(sed -n 's/^Environment=//p' "$root/usr/lib/systemd/system/kvmtune-audit.service")
in_root sh -c ". /etc/default/kvmtune; export $env_line; exec kvmtune config show" > "$work/config.txt"
head -1 "$work/config.txt"
grep -qx '# files read: /etc/kvmtune/kvmtune.toml' "$work/config.txt" || {
  cat "$work/config.txt" >&2; echo "deb-proof.sh: kvmtune config show does not name /etc/kvmtune/kvmtune.toml" >&2; exit 1; }
if grep ' = ' "$work/config.txt" | grep -v '  # default (' >&2; then
  echo "deb-proof.sh: the shipped settings file sets the values above; every key should be commented out" >&2; exit 1
fi
for service in kvmtune-audit kvmtune-sample; do
  step "$service.service's ExecStart lines, as the unit runs them (its Environment, /etc/default/kvmtune)"
  unit=$root/usr/lib/systemd/system/$service.service
  env_line=$(sed -n 's/^Environment=//p' "$unit")
  while IFS= read -r exec; do
    rc=0; in_root sh -c ". /etc/default/kvmtune; export $env_line; exec $exec" || rc=$?
    [ "$rc" -le 1 ] || { echo "deb-proof.sh: ExecStart=$exec exited $rc" >&2; exit 1; }
  done < <(sed -n 's/^ExecStart=//p' "$unit")
done
python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$root/var/lib/kvmtune/audit.json"
for prom in "$root"/var/lib/prometheus/node-exporter/kvmtune{,-live}.prom; do
  [ -s "$prom" ] || { echo "deb-proof.sh: ${prom#"$root"} was not written" >&2; exit 1; }
  if command -v promtool >/dev/null; then
    promtool check metrics < "$prom"; echo "   promtool check metrics ${prom#"$root"}: ok ($(grep -c '^kvmtune' "$prom") samples)"
  fi
done

step "systemctl enable both timers (offline, in the chroot), as an operator would before changing their mind"
in_root systemctl enable kvmtune-audit.timer kvmtune-sample.timer 2>&1 | sed 's/^/   /'
for timer in kvmtune-audit.timer kvmtune-sample.timer; do
  [ -L "$root/etc/systemd/system/timers.target.wants/$timer" ] || { echo "deb-proof.sh: systemctl enable made no link for $timer" >&2; exit 1; }
done
step "apt-get purge kvmtune; compare with the system before it (no enable link, no deb-systemd-helper state left)"
in_root apt-get purge -y -q kvmtune >/dev/null
snapshot > "$work/after"
if ! diff "$work/before" "$work/after" > "$work/diff"; then
  cat "$work/diff" >&2; echo "deb-proof.sh: the purge left the files above" >&2; exit 1
fi
# /var/cache/man is man-db's cache of formatted pages (`man kvmtune` above made one); mandb expires it, no package owns it
left=$(cd "$root" && find . -xdev \( -path ./proc -o -path ./sys -o -path ./dev -o -path ./tmp -o -path ./var/cache/man \) -prune \
  -o -iname '*kvmtune*' -print)
[ -z "$left" ] || { echo "$left" >&2; echo "deb-proof.sh: kvmtune's files are left after the purge" >&2; exit 1; }
step "done: $suite installs, runs and purges clean"
