#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tracer::fuzz::cpu_stat(data));
