//! Per-cgroup state: stop histograms, sums, wall-clock unions, group stops, open stops.
