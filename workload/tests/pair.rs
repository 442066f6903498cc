//! The workload's own test (it also makes `cargo test -p throttle-workload` build the binary the
//! tracer's tests run): the thread ids `pair` prints are its threads of those names, as the
//! kernel lists them.
use std::{
    fs,
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
};

#[test]
fn pair_prints_the_ids_of_its_spinner_and_its_sleeper() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_throttle-workload"))
        .args(["pair", "--seconds", "5"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start throttle-workload pair");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped stdout"))
        .read_line(&mut line)
        .expect("read its first line");
    let words: Vec<&str> = line.split_whitespace().collect();
    let ["tids", "spinner", spinner, "sleeper", sleeper] = words[..] else {
        panic!("not a tids line: {line:?}");
    };
    let pid = child.id();
    for (tid, name) in [(spinner, "spinner"), (sleeper, "sleeper")] {
        let comm = fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
            .unwrap_or_else(|e| panic!("/proc/{pid}/task/{tid}/comm: {e}"));
        assert_eq!(comm.trim_end(), name, "thread {tid}");
    }
    child.kill().expect("kill the pair");
    child.wait().expect("reap the pair");
}
