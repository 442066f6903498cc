#!/bin/busybox sh
# /init of the xtask VMs (busybox sh). The host appends the task's own part to this prelude.
# Everything the host reads is printed between "@@TT ..." markers on the console.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tracefs tracefs /sys/kernel/tracing
mount -t debugfs debugfs /sys/kernel/debug
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t bpf bpf /sys/fs/bpf
echo +cpu > /sys/fs/cgroup/cgroup.subtree_control

mark() { echo "@@TT $*"; }

# section NAME FILE: the file's lines between BEGIN and END markers.
section() {
    echo "@@TT BEGIN $1"
    cat "$2"
    echo
    echo "@@TT END $1"
}

# in_cgroup CGROUP-DIR COMMAND...: runs the command inside the cgroup.
in_cgroup() {
    cg=$1
    shift
    sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$cg" "$@"
}

mark "UNAME $(uname -r)"
