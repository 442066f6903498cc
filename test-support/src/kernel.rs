//! The running kernel's release and what its version tells: from 6.18 the kernel throttles
//! tasks one by one at their return to user mode rather than whole runqueues, so its throttled
//! clocks start at the first task parked, not at the throttle; from 6.6 a runqueue throttled
//! while empty starts its clock only at its first enqueue (79462e8c879a, "sched: don't account
//! throttle time for empty groups").

/// The running kernel's release (`uname -r`).
pub fn release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_else(|e| panic!("read /proc/sys/kernel/osrelease: {e}"))
        .trim()
        .to_owned()
}

/// (major, minor) of a release (`6.18.44-fc` → (6, 18)); 0 for a part that is no number.
pub fn version(release: &str) -> (u32, u32) {
    let mut numbers = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse::<u32>().unwrap_or(0));
    (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0))
}

/// Whether a kernel of `release` throttles tasks rather than runqueues (6.18+).
pub fn task_based_throttle(release: &str) -> bool {
    version(release) >= (6, 18)
}

/// Whether a stop of a runqueue with no task queued adds nothing to cpu.stat on a kernel of
/// `release` (6.6+: its clock waits for a task; 6.18+: for a task parked).
pub fn empty_stops_unaccounted(release: &str) -> bool {
    version(release) >= (6, 6)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_release_tells() {
        // (release, task-based throttle: 6.18+, empty stops unaccounted: 6.6+)
        for (release, task_based, unaccounted) in [
            ("5.10.0-43-cloud-amd64", false, false),
            ("6.1.0-50-cloud-amd64", false, false),
            ("6.12.117+deb12-cloud-amd64", false, true),
            ("6.18.44-fc-v657", true, true),
            ("7.2.13+deb14-cloud-amd64", true, true),
        ] {
            assert_eq!(task_based_throttle(release), task_based, "{release}");
            assert_eq!(empty_stops_unaccounted(release), unaccounted, "{release}");
        }
    }
}
