#!/usr/bin/env bash
# Start or stop the system services kvmtune uses, on machines without systemd.
#   libvirtd-start | libvirtd-stop | libvirtd-status
set -euo pipefail

libvirtd_running() { virsh -c qemu:///system version >/dev/null 2>&1; }

# A daemon keeps every descriptor it inherits for as long as it runs, so it
# starts with none but 0-2: otherwise it would hold its caller's lock (flock)
# or pipe open, and whoever waits for that would wait for ever.
daemon() {
  (
    for fd in /proc/self/fd/*; do
      fd=${fd##*/}
      if [ "$fd" -gt 2 ]; then eval "exec $fd>&-"; fi
    done
    exec "$@" </dev/null
  )
}

case "${1:-}" in
  libvirtd-start)
    if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
      systemctl start virtlogd libvirtd 2>/dev/null || true
    fi
    if ! libvirtd_running; then
      mkdir -p /run/libvirt /var/run/libvirt
      pgrep -x virtlogd >/dev/null || daemon virtlogd -d
      pgrep -x libvirtd >/dev/null || daemon libvirtd -d
      for _ in $(seq 1 50); do libvirtd_running && break; sleep 0.2; done
    fi
    libvirtd_running || { echo "services.sh: libvirtd did not answer on qemu:///system" >&2; exit 1; }
    ;;
  libvirtd-stop)
    pkill -x libvirtd || true
    pkill -x virtlogd || true
    ;;
  libvirtd-status)
    libvirtd_running && echo running || { echo stopped; exit 1; }
    ;;
  *)
    echo "usage: $0 libvirtd-start|libvirtd-stop|libvirtd-status" >&2
    exit 2
    ;;
esac
