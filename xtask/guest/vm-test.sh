# vm-test's part of /init: what the tracer's doctor says of this kernel, then one function per
# scenario step; the host appends the calls.

# serve_selection's exporter listens on 127.0.0.1.
ip link set lo up

# As JSON: the doctor row reads its choice, and host_test hands it to the host tests as root's
# doctor of this boot (TT_ROOT_DOCTOR), which they would otherwise run again.
throttle-tracer doctor --json > /tmp/doctor.json 2> /tmp/doctor.log
mark "DOCTOR exit status $?"
cat /tmp/doctor.json /tmp/doctor.log > /tmp/doctor
section doctor /tmp/doctor

# tracer_start BACKEND NAME...: makes the cgroup of every scenario NAME of BACKEND and starts one
# tracer for them all (a start is most of a short scenario's time under TCG), on CPU 0, away from
# s1's pinned thread, whose stops would shrink by what the tracer ran. Each cgroup is created
# before the tracer starts and its workload only after, as when the tracer is run by hand.
# Its log filter $tracer_log (set by the host) makes it name the programs it attached.
tracer_start() {
    backend=$1
    shift
    # The host leaves a backend out of a kernel's matrix with tt.skip_BACKEND (kernels.rs).
    if grep -qw "tt.skip_$backend" /proc/cmdline; then
        tracer=
        return
    fi
    selection=
    for name in "$@"; do
        mkdir "/sys/fs/cgroup/$name"
        selection="$selection --cgroup /$name"
    done
    out=/tmp/tracer-$backend
    RUST_LOG=$tracer_log taskset -c 0 throttle-tracer --json --backend "$backend" $selection \
        > "$out.ndjson" 2> "$out.stderr" &
    tracer=$!
    waited=0
    until grep -q '"type":"start"' "$out.ndjson"; do
        if ! kill -0 "$tracer" 2> /dev/null || [ "$waited" -ge 3600 ]; then
            kill -KILL "$tracer" 2> /dev/null
            wait "$tracer"
            status=$?
            for name in "$@"; do
                mark "FAIL $name the tracer printed no start line (exit status $status)"
            done
            section "tracer-$backend/ndjson" "$out.ndjson"
            section "tracer-$backend/stderr" "$out.stderr"
            tracer=
            return
        fi
        sleep 0.05
        waited=$((waited + 1))
    done
    # The tracer's own start-up work (on CPU 0, but single-threaded TCG runs both vCPUs on one
    # host thread) disturbed the first stops of s1 on 6.1 (62-67 ms): let it finish first.
    sleep 0.5
}

# tracer_stop BACKEND NAME...: ends the backend's tracer and prints, for each scenario NAME, the
# tracer's exit status and the NDJSON lines of its cgroup (and its children) with the run's
# `start` and `end` lines.
tracer_stop() {
    backend=$1
    shift
    [ -n "$tracer" ] || return
    out=/tmp/tracer-$backend
    kill -INT "$tracer"
    (sleep 30 && kill -KILL "$tracer") 2> /dev/null &
    watchdog=$!
    wait "$tracer"
    status=$?
    kill "$watchdog" 2> /dev/null
    for name in "$@"; do
        mark "TRACER $name exit status $status"
        grep -e '"type":"start"' -e '"type":"end"' -e "\"cgroup\":\"/$name\"" \
            -e "\"cgroup\":\"/$name/" "$out.ndjson" > "/tmp/$name.ndjson"
        section "$name/ndjson" "/tmp/$name.ndjson"
        section "$name/stderr" "$out.stderr"
    done
}

# cost_attach BACKEND: attaches an empty program beside each of the BPF programs of the backend's
# running tracer, for a measurement of their cost over one scenario (xtask guest-program-cost,
# bench/vm_cost.rs); returns once they are attached.
cost_attach() {
    [ -n "$tracer" ] || return
    rm -f "/tmp/cost-$1.begin" "/tmp/cost-$1.end"
    xtask guest-program-cost --log "/tmp/tracer-$1.stderr" \
        --begin "/tmp/cost-$1.begin" --end "/tmp/cost-$1.end" > "/tmp/cost-$1" 2>&1 &
    cost=$!
    cost_wait "$1" attached
}

# cost_wait BACKEND LINE: until the measurement printed LINE or ended (at most a minute).
cost_wait() {
    waited=0
    until grep -q "^$2" "/tmp/cost-$1"; do
        if ! kill -0 "$cost" 2> /dev/null || [ "$waited" -ge 1200 ]; then
            break
        fi
        sleep 0.05
        waited=$((waited + 1))
    done
}

# cost_begin BACKEND: the measurement's window opens.
cost_begin() {
    [ -n "$cost" ] || return
    touch "/tmp/cost-$1.begin"
    cost_wait "$1" measuring
}

# cost_end BACKEND NAME: the window closes; prints the measurement as the scenario NAME's.
cost_end() {
    [ -n "$cost" ] || return
    touch "/tmp/cost-$1.end"
    wait "$cost"
    mark "COST $2 exit status $?"
    section "cost-$2" "/tmp/cost-$1"
    cost=
}

# scenario NAME BACKEND "QUOTA PERIOD" BURST WORKLOAD-COMMAND...: one workload in the cgroup NAME
# that tracer_start made, traced by the backend's tracer.
# BURST "-" leaves cpu.max.burst alone; "0" is written where the kernel has the file.
# WORKLOAD-COMMAND "pinned SECONDS": one busy thread pinned to CPU 0 and one pinned to CPU 1 in
# the quota's group; "children SECONDS": the same in each of two child cgroups c1, c2 of the
# quota's group (the quota lives on their parent). The quota holds for SECONDS while all run.
# "offline CYCLES": one busy thread pinned to CPU 2, which is taken offline and back CYCLES
# times while the group is stopped (offline_cycles).
scenario() {
    name=$1 backend=$2 max=$3 burst=$4
    shift 4
    if [ -z "$tracer" ]; then
        return
    fi
    cg=/sys/fs/cgroup/$name
    echo "$max" > "$cg/cpu.max"
    if [ "$burst" != "-" ]; then
        if [ -e "$cg/cpu.max.burst" ]; then
            echo "$burst" > "$cg/cpu.max.burst"
        elif [ "$burst" != 0 ]; then
            mark "SKIP $name cpu.max.burst does not exist (burst is 5.14+)"
            return
        fi
    fi
    mark "SCENARIO $name cpu.max=$(cat "$cg/cpu.max") workload=$*"
    if [ "$1" = children ]; then
        echo +cpu > "$cg/cgroup.subtree_control"
        mkdir "$cg/c1" "$cg/c2"
    fi
    out=/tmp/$name

    section "$name/cpu.stat.before" "$cg/cpu.stat"
    if [ "$1" = children ] || [ "$1" = pinned ]; then
        dirs=$cg
        if [ "$1" = children ]; then
            children_stat "$name" "$cg" before
            dirs="$cg/c1 $cg/c2"
        fi
        # The quota holds only while all threads run, and they are killed together: each
        # group then has a task on each CPU at every stop (threads starting or ending one by
        # one would leave a CPU with one child's task, which the kernel credits alone, or a
        # throttled period that stops one CPU).
        echo max > "$cg/cpu.max"
        pids=
        for dir in $dirs; do
            for cpu in 0 1; do
                busy_in "$dir" "$cpu" >> "$out.workload" 2>&1 &
                pids="$pids $!"
            done
        done
        sleep 0.3
        echo "$max" > "$cg/cpu.max"
        sleep "$2"
        # Status 0: all were still running when killed.
        kill -KILL $pids
        status=$?
        wait $pids
        mark "WORKLOAD $name exit status $status"
    elif [ "$1" = offline ]; then
        offline_cycles "$cg" "$2" >> "$out.workload" 2>&1
        mark "WORKLOAD $name exit status $?"
    else
        in_cgroup "$cg" "$@" > "$out.workload" 2>&1
        mark "WORKLOAD $name exit status $?"
    fi
    # Longer than one period: the last stop's unthrottle happens and is accounted.
    sleep 0.3
    section "$name/cpu.stat.after" "$cg/cpu.stat"
    if [ "$1" = children ]; then
        children_stat "$name" "$cg" after
    fi
    section "$name/workload" "$out.workload"
}

# children_stat NAME CGROUP-DIR before|after: c1's and c2's cpu.stat, and cpu.stat.local where
# the kernel has it (6.6+).
children_stat() {
    for child in c1 c2; do
        section "$1/$child/cpu.stat.$3" "$2/$child/cpu.stat"
        if [ -e "$2/$child/cpu.stat.local" ]; then
            section "$1/$child/cpu.stat.local.$3" "$2/$child/cpu.stat.local"
        fi
    done
}

# busy_in CGROUP-DIR CPU: one busy thread pinned to CPU inside the cgroup until it is killed.
# Run it in the background: it execs, so $! is the workload itself.
busy_in() {
    exec sh -c 'echo $$ > "$0/cgroup.procs" &&
        exec taskset -c "$1" throttle-workload busy --threads 1 --seconds 600' "$1" "$2"
}

# now_ns: CLOCK_MONOTONIC in ns, the clock of the tracer's times (busybox's date has no %N).
now_ns() {
    head -n 3 /proc/timer_list | sed -n 's/^now at \([0-9]*\) nsecs$/\1/p'
}

# stat_field CGROUP-DIR FIELD: one field of the cgroup's cpu.stat.
stat_field() {
    sed -n "s/^$2 //p" "$1/cpu.stat"
}

# offline_cycles CGROUP-DIR CYCLES: the guest boots 4 vCPUs with 2 online (qemu.rs); CPUs 2 and 3
# come online, one busy thread pinned to CPU 2 runs in the cgroup, and CYCLES times CPU 2 is taken
# offline while the group is stopped there and brought back 0.5 s later, its thread pinned there
# again (the kernel moved it off and widened its affinity). The offline write takes 60 to 100 ms
# under TCG before the kernel unthrottles the CPU's runqueues, so it starts early in a stop: after
# a refill (nr_periods moved), once the group has not run for 20 ms. Prints, per cycle,
# `offline from_ns A until_ns B periods_moved 0|1` (the write's span; whether the period timer
# ran meanwhile: then the cycle is tried again, at most twice more in all) and
# `online from_ns C until_ns D`; then CPUs 2 and 3 go offline again.
offline_cycles() {
    for cpu in 2 3; do
        echo 1 > "/sys/devices/system/cpu/cpu$cpu/online" || return 1
    done
    busy_in "$1" 2 &
    pid=$!
    # Its spinner runs (an exec under TCG takes a while): the group has been stopped twice.
    polls=0
    until [ "$(stat_field "$1" nr_throttled)" -ge 2 ]; do
        polls=$((polls + 1))
        [ "$polls" -le 200 ] || { echo "never throttled twice in 10 s"; return 1; }
        sleep 0.05
    done
    cycle=0
    tries=0
    while [ "$cycle" -lt "$2" ] && [ "$tries" -lt $(($2 + 2)) ]; do
        tries=$((tries + 1))
        periods=$(stat_field "$1" nr_periods)
        while [ "$(stat_field "$1" nr_periods)" = "$periods" ]; do
            sleep 0.01
        done
        usage=
        until [ "$(stat_field "$1" usage_usec)" = "$usage" ]; do
            usage=$(stat_field "$1" usage_usec)
            sleep 0.02
        done
        periods=$(stat_field "$1" nr_periods)
        from=$(now_ns)
        echo 0 > /sys/devices/system/cpu/cpu2/online || return 1
        until=$(now_ns)
        moved=0
        [ "$(stat_field "$1" nr_periods)" = "$periods" ] || moved=1
        # A cycle counts unless the period timer ran during the write: it may have ended the
        # stop first.
        [ "$moved" = 1 ] || cycle=$((cycle + 1))
        echo "offline from_ns $from until_ns $until periods_moved $moved"
        sleep 0.5
        from=$(now_ns)
        echo 1 > /sys/devices/system/cpu/cpu2/online || return 1
        until=$(now_ns)
        echo "online from_ns $from until_ns $until"
        taskset -a -p -c 2 "$pid" > /dev/null || return 1
        sleep 1
    done
    kill -KILL "$pid"
    wait "$pid"
    for cpu in 2 3; do
        echo 0 > "/sys/devices/system/cpu/cpu$cpu/online" || return 1
    done
}

# host_test BINARY TEST [BACKEND]: one of the tracer's host tests (tracer/tests/BINARY.rs) on this
# kernel's cgroup v2 hierarchy, as CI runs them: CI=true makes a skip a failure. With the kprobe
# backend unless BACKEND says otherwise (the fault tests, guest_tests.rs FAULTS; the run is then
# named BINARY::TEST@BACKEND): kprobe's programs load in 3 s here, the tracepoint backend's in 30
# to 40 s (test-support backend()).
host_test() {
    run=$1::$2${3:+@$3}
    out=/tmp/test-$1-$2${3:+-$3}
    mark "TEST $run"
    CI=true TT_TEST_BACKEND=${3:-kprobe} TT_TEST_EMULATED=1 TT_ROOT_DOCTOR=/tmp/doctor.json \
        "/tests/$1" --exact "$2" --test-threads=1 --show-output \
        > "$out" 2>&1
    mark "TESTED $run exit status $?"
    section "test/$run" "$out"
}
