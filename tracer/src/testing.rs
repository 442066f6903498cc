//! What the unit tests that read this machine share (the host tests have theirs in
//! tests/common): a test that cannot run here either lacks something this machine should have,
//! which fails under `CI=true` ([`missing`]), or checks a fact of another kernel
//! ([`not_applicable`]), which never fails. Both say so on stderr.

/// This machine lacks what the test needs: a failure under `CI=true`, else a visible skip.
pub fn missing(reason: &str) {
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI=true: this test must run here, but {reason}"
    );
    eprintln!("skipped: {reason}");
}

/// The test checks another kernel's facts.
pub fn not_applicable(reason: &str) {
    eprintln!("not applicable here: {reason}");
}
