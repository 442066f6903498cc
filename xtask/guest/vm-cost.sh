# vm-test --cost's part of /init (bench/vm_cost.rs): the kprobe and fentry programs' cost.

# cost_run BACKEND: one busy thread pinned to each vCPU in the cgroup cost-BACKEND at 50 ms /
# 100 ms, traced by the backend's tracer (its log filter names the programs it attached) with
# `xtask guest-program-cost` beside it: empty programs on the same hooks, and the kernel's
# run-time statistics of both over 2 s of the load, after 1 s that warms them. Prints the
# measurement and the cgroup's cpu.stat around the window.
cost_run() {
    name=cost-$1
    cg=/sys/fs/cgroup/$name
    out=/tmp/$name
    mkdir "$cg"
    echo "50000 100000" > "$cg/cpu.max"
    RUST_LOG='warn,throttle_tracer::probes=debug' taskset -c 0 \
        throttle-tracer --json --backend "$1" --cgroup "/$name" > "$out.ndjson" 2> "$out.log" &
    tracer=$!
    until grep -q '"type":"start"' "$out.ndjson"; do
        kill -0 "$tracer" 2> /dev/null || break
        sleep 0.05
    done
    rm -f "$out.begin" "$out.end"
    xtask guest-program-cost --log "$out.log" --begin "$out.begin" --end "$out.end" \
        > "$out" 2>&1 &
    cost=$!
    until grep -q '^attached' "$out" || ! kill -0 "$cost" 2> /dev/null; do
        sleep 0.05
    done
    pids=
    for cpu in 0 1; do
        in_cgroup "$cg" taskset -c "$cpu" throttle-workload busy --threads 1 --seconds 4 &
        pids="$pids $!"
    done
    sleep 1
    section "$name/cpu.stat.before" "$cg/cpu.stat"
    touch "$out.begin"
    sleep 2
    touch "$out.end"
    section "$name/cpu.stat.after" "$cg/cpu.stat"
    wait "$cost"
    mark "COST $name exit status $?"
    section "$name" "$out"
    wait $pids
    kill -INT "$tracer"
    wait "$tracer"
    rmdir "$cg"
}
