//! The cgroup hierarchy that holds the cpu controller: id <-> path.
