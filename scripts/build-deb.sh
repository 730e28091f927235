#!/usr/bin/env bash
# Build the Debian package kvmtune_V_amd64.deb into OUTDIR (default dist/), with dpkg-deb from a staged tree
# (packaging/deb/ holds its control file, maintainer scripts, units, copyright and changelog):
#   /usr/bin/kvmtune, the Python package in /usr/lib/python3/dist-packages/kvmtune (netload inside, stamped
#   like the wheel), kvmtune(8), bash/zsh/fish completions, kvmtune-audit and kvmtune-sample services + timers,
#   /etc/default/kvmtune and /etc/kvmtune/kvmtune.toml (conffiles; the settings file with every key commented out),
#   README.md and docs/*.md in /usr/share/doc/kvmtune (what the man page's SEE ALSO names),
#   the textfile directory /var/lib/prometheus/node-exporter.
# Needs dpkg-deb, Go (netload) and this checkout's .venv (or python3 with lxml) to generate the man page.
set -euo pipefail
cd "$(dirname "$0")/.."
here=$PWD
export PATH="$PATH:/usr/local/go/bin"
out=${1:-dist}
mkdir -p "$out"
out=$(cd "$out" && pwd)
GOARCH=amd64 make -s -C netload build
netload_version=$(netload/bin/netload version | awk '{print $2}')
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml)
commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
if [ "$commit" != unknown ] && [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  commit="$commit-dirty"
fi
# reproducible: every file's time and the man page's date are the last commit's
SOURCE_DATE_EPOCH=$(git log -1 --format=%ct 2>/dev/null || date +%s)
export SOURCE_DATE_EPOCH
py=.venv/bin/python
[ -x "$py" ] || py=python3
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root=$stage/root
src=packaging/deb
install -d -m 755 "$root"/DEBIAN "$root"/usr/bin "$root"/usr/lib/python3/dist-packages \
  "$root"/usr/share/man/man8 "$root"/usr/share/bash-completion/completions "$root"/usr/share/zsh/vendor-completions \
  "$root"/usr/share/fish/vendor_completions.d "$root"/usr/lib/systemd/system "$root"/etc/default "$root"/etc/kvmtune \
  "$root"/usr/share/doc/kvmtune "$root"/usr/share/lintian/overrides "$root"/var/lib/prometheus/node-exporter
# the Python package: sources and data, no bytecode (postinst compiles it, prerm removes it)
tar -C src --exclude=__pycache__ --exclude='*.pyc' --exclude=_bin --exclude=_build.json -cf - kvmtune | tar -C "$root"/usr/lib/python3/dist-packages -xf -
pkg=$root/usr/lib/python3/dist-packages/kvmtune
install -D -m 755 netload/bin/netload "$pkg"/_bin/netload
printf '{"version": "%s", "commit": "%s", "netload": "%s"}\n' "$version" "$commit" "$netload_version" > "$pkg"/_build.json
find "$pkg" -type f -exec chmod 644 {} + && chmod 755 "$pkg"/_bin/netload
find "$pkg" -type d -exec chmod 755 {} +
install -m 755 $src/kvmtune "$root"/usr/bin/kvmtune
gen() { PYTHONPATH="$here/src" "$py" -m kvmtune "$@"; }
gen man | gzip -9n > "$root"/usr/share/man/man8/kvmtune.8.gz
gen completion bash > "$root"/usr/share/bash-completion/completions/kvmtune
gen completion zsh > "$root"/usr/share/zsh/vendor-completions/_kvmtune
gen completion fish > "$root"/usr/share/fish/vendor_completions.d/kvmtune.fish
install -m 644 $src/kvmtune-audit.service $src/kvmtune-audit.timer $src/kvmtune-sample.service $src/kvmtune-sample.timer \
  $src/kvmtune-canary.service $src/kvmtune-canary.timer $src/kvmtune-canary-boot.service "$root"/usr/lib/systemd/system/
# the drift canary's apt hook: a no-op unless KVMTUNE_CANARY_APT_HOOK=yes in /etc/default/kvmtune
install -D -m 755 $src/canary-apt-hook "$root"/usr/lib/kvmtune/canary-apt-hook
install -D -m 644 $src/apt-80kvmtune-canary "$root"/etc/apt/apt.conf.d/80kvmtune-canary
install -m 644 $src/default "$root"/etc/default/kvmtune
install -m 644 $src/kvmtune.toml "$root"/etc/kvmtune/kvmtune.toml
install -m 644 $src/copyright "$root"/usr/share/doc/kvmtune/copyright
# the documents kvmtune(8) and the settings file point to (shelldocs.SHIPPED_DOCS): README.md and docs/*.md
install -m 644 README.md docs/*.md "$root"/usr/share/doc/kvmtune/
gzip -9n < $src/changelog > "$root"/usr/share/doc/kvmtune/changelog.gz
install -m 644 $src/lintian-overrides "$root"/usr/share/lintian/overrides/kvmtune
chmod 644 "$root"/usr/share/man/man8/kvmtune.8.gz "$root"/usr/share/doc/kvmtune/changelog.gz \
  "$root"/usr/share/bash-completion/completions/kvmtune "$root"/usr/share/zsh/vendor-completions/_kvmtune \
  "$root"/usr/share/fish/vendor_completions.d/kvmtune.fish
install -m 755 $src/postinst $src/prerm $src/postrm "$root"/DEBIAN/
printf '%s\n' /etc/default/kvmtune /etc/kvmtune/kvmtune.toml /etc/apt/apt.conf.d/80kvmtune-canary > "$root"/DEBIAN/conffiles
chmod 644 "$root"/DEBIAN/conffiles
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
sed -e "s/@VERSION@/$version/" -e "s/@SIZE@/$size/" $src/control.in > "$root"/DEBIAN/control
(cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | LC_ALL=C sort -z | xargs -0 md5sum) > "$root"/DEBIAN/md5sums
chmod 644 "$root"/DEBIAN/control "$root"/DEBIAN/md5sums
find "$root" -newermt "@$SOURCE_DATE_EPOCH" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
rm -f "$out"/kvmtune_*.deb
dpkg-deb --root-owner-group -Zxz --build "$root" "$out/kvmtune_${version}_amd64.deb" >/dev/null
ls "$out/kvmtune_${version}_amd64.deb"
