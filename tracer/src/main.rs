//! The `throttle-tracer` binary: the program is the library's (lib.rs).

fn main() {
    throttle_tracer::main();
}
