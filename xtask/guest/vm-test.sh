# vm-test's part of /init: what the tracer's doctor says of this kernel, then the host tests the
# host appends (guest_tests.rs), each run by `host_test`.

# serve_selection's exporter listens on 127.0.0.1.
ip link set lo up

# As JSON: the doctor row reads its choice, and host_test hands it to the host tests as root's
# doctor of this boot (TT_ROOT_DOCTOR), which they would otherwise run again.
throttle-tracer doctor --json > /tmp/doctor.json 2> /tmp/doctor.log
mark "DOCTOR exit status $?"
cat /tmp/doctor.json /tmp/doctor.log > /tmp/doctor
section doctor /tmp/doctor

# host_test BINARY TEST [BACKEND]: one of the tracer's host tests (tracer/tests/BINARY.rs) on this
# kernel's cgroup v2 hierarchy, as CI runs them: CI=true makes a skip a failure. With the kprobe
# backend unless BACKEND says otherwise; the run is then named BINARY::TEST@BACKEND.
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
