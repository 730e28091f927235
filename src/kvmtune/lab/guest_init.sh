#!/bin/sh
# kvmtune probe guest init (PID 1). Mounts the pseudo filesystems, loads the
# modules listed in /etc/kvmtune/modules (already in dependency order), then
# runs the job that the host passed through fw_cfg (opt/kvmtune/job) and
# powers off. Everything the host parses is a line starting with KVMTUNE-.
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
export LD_LIBRARY_PATH=@LD_LIBRARY_PATH@
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /tmp /mnt
echo "KVMTUNE-BOOTED $(cut -d' ' -f1 /proc/uptime)"
while read -r m; do
    insmod "/lib/modules/$m" 2>/dev/null || echo "KVMTUNE-WARN insmod $m failed"
done < /etc/kvmtune/modules
job=/sys/firmware/qemu_fw_cfg/by_name/opt/kvmtune/job/raw
if [ -r "$job" ]; then
    cat "$job" > /tmp/job.sh
    echo "KVMTUNE-JOB-START $(cut -d' ' -f1 /proc/uptime)"
    sh /tmp/job.sh
    echo "KVMTUNE-JOB-EXIT $?"
else
    echo "KVMTUNE-NOJOB"
fi
sync
echo "KVMTUNE-POWEROFF $(cut -d' ' -f1 /proc/uptime)"
poweroff -f
