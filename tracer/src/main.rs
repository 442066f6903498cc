//! `throttle-tracer`: traces every CFS bandwidth stop and reports what the quota really did.
mod aggregate;
mod btf;
mod cgroups;
mod cpustat;
mod records;
mod report;

fn main() {}
