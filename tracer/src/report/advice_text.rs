//! The demand and advice block of a cgroup in the text report (and all `advise` prints): its
//! busy runs, then the quota, burst and period that fit them, each as the files and runtimes
//! that set it and with what it costs.

use std::fmt::Write;

use super::CgroupReport;
use crate::advice::{Advice, Setting};
use crate::aggregate::{DemandSummary, Percentiles};
use crate::cgroups::Version;
use crate::schema::{End, Start};
use crate::units::ms;

/// `throttle-tracer advise`'s whole text: how long it traced and that the advice covers only
/// that, then each measured cgroup's block under its path.
pub(super) fn standalone(start: &Start, reports: &[CgroupReport], totals: &End) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "throttle-tracer advise: traced for {} s ({} backend). The advice covers only what the \
         trace saw: a busier stretch than it saw needs more.",
        secs(totals.elapsed_ns),
        start.backend
    );
    let measured: Vec<&CgroupReport> = reports
        .iter()
        .filter(|r| r.summary.demand.is_some())
        .collect();
    if measured.is_empty() {
        out.push_str(
            "\nNo period of a cgroup with a quota was measured. Demand is measured at each \
             expiry of a traced cgroup's period timer, so only in cgroups that ran under their \
             quota while tracing (a warning at the start says when this kernel does not allow \
             it).\n",
        );
    }
    for r in measured {
        let _ = writeln!(
            out,
            "\n{}",
            r.path
                .as_deref()
                .unwrap_or("(a cgroup removed while tracing)")
        );
        render(&mut out, r, start);
    }
    out
}

/// The block, or nothing when no period of the cgroup was measured.
pub(super) fn render(out: &mut String, r: &CgroupReport, start: &Start) {
    let Some(d) = &r.summary.demand else {
        return;
    };
    demand(out, d);
    match r.advice(start.advice_target.unwrap_or_default()) {
        Some(a) => advice(out, &a, start.cgroup_version),
        None if d.runs.count == 0 => {
            out.push_str("  advice            none: no busy run was measured\n");
        }
        None => out.push_str("  advice            none: the cgroup has no quota\n"),
    }
}

fn percentiles(p: &Percentiles) -> String {
    format!(
        "p50 {}   p90 {}   p99 {}   max {}",
        ms(p.p50_ns),
        ms(p.p90_ns),
        ms(p.p99_ns),
        ms(p.max_ns)
    )
}

fn demand(out: &mut String, d: &DemandSummary) {
    let _ = writeln!(
        out,
        "  demand            {} periods measured ({}), {} ended throttled; {} of CPU used",
        d.periods,
        ms(d.covered_ns),
        d.throttled_periods,
        ms(d.usage_ns)
    );
    let _ = write!(out, "  busy runs         {}", d.runs.count);
    if let Some(p) = d.runs.percentiles {
        let _ = write!(out, "   {}", percentiles(&p));
    }
    let _ = writeln!(out, "   most CPUs in one period {}", d.max_cpus);
    if let Some(spent) = d.burst_spent_ns {
        let _ = writeln!(
            out,
            "  burst spent       {} (runtime carried over past the quota, as cpu.stat burst_time counts it)",
            ms(spent)
        );
    }
    if let Some(p) = d.waiting.percentiles {
        let _ = writeln!(
            out,
            "  work waiting      at a throttled period's end: {} ({} periods; what the held threads ran after the refill before they slept)",
            percentiles(&p),
            d.waiting.count
        );
    }
    if d.holds_unplaced > 0 {
        let _ = writeln!(
            out,
            "  work waiting      {} holds came for no throttled period still open to them (older than the last 128, or a refill between boundaries): in no figure",
            d.holds_unplaced
        );
    }
    for run in &d.largest {
        let _ = writeln!(
            out,
            "    run of {} over {} period(s), {} throttled, {} CPU(s), {} to {} s (monotonic)",
            ms(run.demand_ns),
            run.periods,
            run.throttled_periods,
            run.cpus,
            secs(run.start_ns),
            secs(run.end_ns)
        );
    }
    if let Some(u) = d.unfinished {
        let _ = writeln!(
            out,
            "    still stopped at the end: a run of at least {} over {} period(s)",
            ms(u.demand_ns),
            u.periods
        );
    }
    if d.unknown_periods > 0 || d.broken_runs > 0 {
        let _ = writeln!(
            out,
            "    {} period(s) of unknown usage (the first seen, or a CPU without a reading); {} \
             run(s) with one left out",
            d.unknown_periods, d.broken_runs
        );
    }
}

fn advice(out: &mut String, a: &Advice, version: Option<Version>) {
    let (Some(quota), Some(period)) = (a.current.quota_ns, a.current.period_ns) else {
        return;
    };
    let now_cpus = quota as f64 / period as f64;
    let _ = writeln!(
        out,
        "  advice            from {} of periods: it covers only what the trace saw{}",
        ms(a.covered_ns),
        if a.unfinished_larger {
            "; a run still stopped at the end was larger than all others (a lower bound)"
        } else {
            ""
        }
    );
    let now_millicpus = Setting::millicpus_of(quota, period);
    if let Some(q) = a.recommended {
        let _ = writeln!(
            out,
            "    recommended     quota {} stops at most {} of the periods: {}; entitlement {} CPU \
             ({} against now), longest stop {}. Periods stopped, by the replay of what arrived: \
             {} now, {} with it",
            ms(q.quota_ns),
            share(a.target.share()),
            quota_files(&q, version),
            cpus(q.millicpus),
            change(q.millicpus, now_millicpus),
            ms(q.longest_stop_ns),
            share(a.stopped_now.fraction()),
            share(a.stopped_after.fraction())
        );
        let _ = writeln!(
            out,
            "                    (the target period's demand is {}, with {} for each CPU but one: {})",
            ms(a.target_period_ns),
            a.slice_ns.map_or_else(|| "5.0 ms".to_owned(), ms),
            a.slice_ns.map_or(
                "the kernel's default runtime slice, the machine's was not read",
                |_| "the machine's runtime slice"
            ),
        );
    }
    if let Some(q) = a.no_stop {
        let _ = writeln!(
            out,
            "    no stop         quota {} stops no period of what arrived: {}; entitlement {} CPU \
             ({} against now), longest stop {}",
            ms(q.quota_ns),
            quota_files(&q, version),
            cpus(q.millicpus),
            change(q.millicpus, now_millicpus),
            ms(q.longest_stop_ns)
        );
    }
    if a.fits {
        let _ = writeln!(
            out,
            "    largest run     {} fits the quota ({}) in one period",
            ms(a.largest_run_ns),
            ms(quota)
        );
    } else if let Some(q) = a.quota {
        let _ = writeln!(
            out,
            "    largest run     {} on {} CPU(s) would need {} in one period ({} CPU); a run \
             stretched over periods by the quota itself holds its backlog too, so the no-stop \
             quota above is what arrived",
            ms(a.largest_run_ns),
            a.largest_run_cpus,
            ms(q.quota_ns),
            cpus(q.millicpus),
        );
    }
    let b = &a.burst;
    let burst_file = match version {
        Some(Version::V1) => "cpu.cfs_burst_us",
        _ => "cpu.max.burst",
    };
    if let Some(burst) = b.burst_ns {
        let refill = if Some(burst) == b.for_largest_ns {
            "the quota the runs leave unused refills it before the next run".to_owned()
        } else {
            format!(
                "{} alone lets the largest run through, but the runs come too close for the \
                 refill: {} is what lets every run through",
                ms(b.for_largest_ns.unwrap_or(0)),
                ms(burst)
            )
        };
        let _ = writeln!(
            out,
            "    burst           {burst_file} {} (quota + burst ≥ {}): {refill}; the average \
             entitlement stays {now_cpus:.2} CPU, one period may use {:.2}; the longest stop \
             stays {}. Set by the cgroup file or runc/podman --cgroup-conf, not by the Docker \
             CLI nor the kubelet",
            us(burst),
            ms(quota + burst),
            (quota + burst) as f64 / period as f64,
            ms(period.saturating_sub(quota / u64::from(a.largest_run_cpus.max(1))))
        );
    } else if let Some(why) = &b.why_not {
        let _ = writeln!(out, "    burst           none: {why}");
    }
    if b.configured_useless {
        let _ = writeln!(
            out,
            "    configured burst {} buys nothing: every stopped run needed more than quota + \
             burst ({}), so each still stops as often, at full cost",
            ms(a.current.burst_ns.unwrap_or(0)),
            ms(quota + a.current.burst_ns.unwrap_or(0))
        );
    }
    if let Some(p) = a.period {
        let _ = writeln!(
            out,
            "    period          {} at the same {now_cpus:.2} CPU (quota {}): {}; the average \
             entitlement is unchanged, the longest stop becomes {} (now {}). Kubernetes sets \
             the period only node-wide (kubelet cpuCFSQuotaPeriod)",
            ms(p.period_ns),
            ms(p.quota_ns),
            period_files(&p, version),
            ms(p.longest_stop_ns),
            ms(period.saturating_sub(quota / u64::from(a.largest_run_cpus.max(1))))
        );
    } else if let Some(why) = &a.period_why_not {
        let _ = writeln!(out, "    period          none: {why}");
    }
    if let Some(p) = a.period_target {
        let _ = writeln!(
            out,
            "                    {} (quota {}) stops at most {} of the periods: {}; the longest \
             stop becomes {}",
            ms(p.period_ns),
            ms(p.quota_ns),
            share(a.target.share()),
            period_files(&p, version),
            ms(p.longest_stop_ns)
        );
    }
}

fn quota_files(q: &Setting, version: Option<Version>) -> String {
    let file = match version {
        Some(Version::V1) => format!("cpu.cfs_quota_us {}", us(q.quota_ns)),
        _ => format!("cpu.max \"{} {}\"", us(q.quota_ns), us(q.period_ns)),
    };
    format!(
        "{file}, docker --cpus {}, Kubernetes limits.cpu {}m",
        cpus(q.millicpus),
        q.millicpus
    )
}

fn period_files(p: &Setting, version: Option<Version>) -> String {
    let file = match version {
        Some(Version::V1) => format!(
            "cpu.cfs_period_us {} with cpu.cfs_quota_us {}",
            us(p.period_ns),
            us(p.quota_ns)
        ),
        _ => format!("cpu.max \"{} {}\"", us(p.quota_ns), us(p.period_ns)),
    };
    format!(
        "{file}, docker --cpu-period {} --cpu-quota {}",
        us(p.period_ns),
        us(p.quota_ns)
    )
}

fn secs(ns: u64) -> String {
    format!("{:.3}", ns as f64 / 1e9)
}

fn us(ns: u64) -> u64 {
    ns.div_ceil(1_000)
}

/// A share of periods as a percentage.
fn share(s: f64) -> String {
    format!("{:.2} %", s * 100.0)
}

/// The change in entitlement from `now` to `to` millicpus, signed: a cut frees CPU.
fn change(to: u64, now: u64) -> String {
    let delta = to as i128 - now as i128;
    let sign = if delta < 0 { "-" } else { "+" };
    format!("{sign}{}", cpus(delta.unsigned_abs() as u64))
}

fn cpus(millicpus: u64) -> String {
    format!("{}.{:03}", millicpus / 1000, millicpus % 1000)
}
