//! Recordings made by the tracer before its NDJSON schema became one module (a v1 host, 6.18,
//! tracepoint backend; `all`: every cgroup, with stops begun before tracing and a quota owner
//! whose stops credit two children; `child`: one child alone, so its parent's stops are
//! `ancestor_stop` lines), with what `throttle-tracer report` printed for them then. The
//! schema must read every line and write it back byte for byte, and `report` must print the
//! same text: a field forgotten on one side, or renamed, fails here.
use std::{fs, path::Path, process::Command};

const TRACER: &str = env!("CARGO_BIN_EXE_throttle-tracer");

fn golden(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/golden")
        .join(name)
}

#[test]
fn report_replays_recordings_of_the_earlier_tracer_byte_for_byte() {
    for name in ["all", "child"] {
        let out = Command::new(TRACER)
            .arg("report")
            .arg(golden(&format!("{name}.ndjson")))
            .output()
            .unwrap();
        assert!(out.status.success(), "{name}: {out:?}");
        let want = fs::read_to_string(golden(&format!("{name}.report.txt"))).unwrap();
        assert_eq!(String::from_utf8(out.stdout).unwrap(), want, "{name}");
    }
}

#[test]
fn the_recordings_have_every_line_kind() {
    let text: String = ["all", "child"]
        .map(|name| fs::read_to_string(golden(&format!("{name}.ndjson"))).unwrap())
        .concat();
    for kind in [
        "start",
        "stop_begin",
        "stop",
        "ancestor_stop",
        "unseen_start_stop",
        "summary",
        "end",
    ] {
        let tag = format!("{{\"type\":\"{kind}\",");
        assert!(text.lines().any(|l| l.starts_with(&tag)), "no {kind} line");
    }
    assert!(
        text.contains("\"descendants\":[{"),
        "no quota owner's descendants"
    );
}
