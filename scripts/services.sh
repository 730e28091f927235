#!/usr/bin/env bash
# Start or stop the system services kvmtune uses, on machines without systemd.
#   libvirtd-start | libvirtd-stop | libvirtd-status
set -euo pipefail

libvirtd_running() { virsh -c qemu:///system version >/dev/null 2>&1; }

case "${1:-}" in
  libvirtd-start)
    if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
      systemctl start virtlogd libvirtd 2>/dev/null || true
    fi
    if ! libvirtd_running; then
      mkdir -p /run/libvirt /var/run/libvirt
      pgrep -x virtlogd >/dev/null || virtlogd -d
      pgrep -x libvirtd >/dev/null || libvirtd -d
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
