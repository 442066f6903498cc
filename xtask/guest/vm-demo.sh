# vm-demo's part of /init: two busy threads under half a CPU, traced for five seconds.
cg=/sys/fs/cgroup/demo
mkdir "$cg"
echo "50000 100000" > "$cg/cpu.max"
in_cgroup "$cg" throttle-workload busy --threads 2 --seconds 600 &
workload=$!
throttle-tracer --backend kprobe --cgroup /demo --duration 5s > /tmp/report 2> /tmp/stderr
mark "TRACER demo exit status $?"
kill "$workload"
section demo/report /tmp/report
section demo/stderr /tmp/stderr
