#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| throttle_tracer::fuzz::cgroup_glob(data));
