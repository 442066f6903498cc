//! Cgroups made and removed by the hundred per second while the tracer traces every cgroup
//! (6 s, or `TT_CHURN_SECONDS`: `cargo xtask soak` runs it for its minute); one churned cgroup in
//! 50 is stopped once, two groups throttle the whole time. What must hold: the two groups'
//! traces are complete (against cpu.stat), no churned group's stop begins after its removal, the
//! programs' maps hold only what is open and count what they evicted, and the tracer's memory,
//! and `serve`'s beside it, stay flat after warm-up (10 s, or a third of the run) but for the
//! summaries a plain run keeps for its report. Needs root, kernel BTF and a cpu hierarchy.
use test_support as common;

use std::{
    collections::HashMap,
    fs,
    os::fd::{AsFd, AsRawFd as _},
    os::unix::fs::MetadataExt as _,
    path::Path,
    process::Stdio,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use common::{
    Cgroup, CpuHierarchy, CpuStat, Running,
    tracer::{self, Tracer},
};

/// How long the churn lasts: `TT_CHURN_SECONDS` (the soak's length), else 6 s.
fn churn_for() -> Duration {
    let seconds = std::env::var("TT_CHURN_SECONDS").map_or(6, |s| {
        s.parse()
            .unwrap_or_else(|e| panic!("TT_CHURN_SECONDS={s:?}: {e}"))
    });
    Duration::from_secs(seconds)
}

/// Cgroups made (and removed) per second, at least.
const RATE: u64 = 200;
/// Most memory one stopped cgroup's summary may take (its histograms dominate; 241 stopped
/// cgroups grew a 40 s run's tracer by 436 KiB, 1.8 KiB each).
const SUMMARY_KIB: u64 = 8;
/// One churned cgroup in this many gets a task that its quota stops.
const WITH_TASK: u64 = 50;

/// The tracer's resident memory now, in KiB (/proc/PID/status VmRSS).
fn rss_kib(pid: u32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// This thread's id, as the v1 `tasks` file (and v2 `cgroup.threads`) take it.
fn tid() -> u32 {
    // SAFETY: no preconditions.
    unsafe { libc::gettid() as u32 }
}

/// Spins this thread for `cpu` of its own CPU time.
fn burn(cpu: Duration) {
    let start = cpu_time();
    while cpu_time() - start < cpu {}
}

fn cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to write to.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The file a thread writes its id into to enter the cgroup at `dir`.
fn threads_file(cpu: &CpuHierarchy, dir: &Path) -> std::path::PathBuf {
    match cpu.version {
        common::Version::V1 => dir.join("tasks"),
        common::Version::V2 => dir.join("cgroup.threads"),
    }
}

/// Makes and removes cgroups below `parent` until `stop`, at `RATE` per second; returns how
/// many it made and, for those that held a task, their id and when their removal returned.
fn churn(cpu: &CpuHierarchy, parent: &Path, stop: &AtomicBool) -> (u64, HashMap<u64, u64>) {
    let started = Instant::now();
    let mut made = 0;
    let mut with_task = HashMap::new();
    while !stop.load(Ordering::Relaxed) {
        let dir = parent.join(format!("c{made}"));
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        cpu.set_quota(&dir, Some(1_000), 10_000);
        if made % WITH_TASK == 0 {
            // 8 ms of CPU on a 1 ms quota: stopped at a tick (4 ms at HZ=250) at the latest.
            let id = fs::metadata(&dir).unwrap().ino();
            fs::write(threads_file(cpu, &dir), tid().to_string()).unwrap();
            burn(Duration::from_millis(8));
            fs::write(threads_file(cpu, parent), tid().to_string()).unwrap();
            fs::remove_dir(&dir).unwrap_or_else(|e| panic!("remove {}: {e}", dir.display()));
            with_task.insert(id, common::monotonic_ns());
        } else {
            fs::remove_dir(&dir).unwrap_or_else(|e| panic!("remove {}: {e}", dir.display()));
        }
        made += 1;
        // Paced, not flat out: the rate asked for, and CPU left for the rest.
        let due = started + Duration::from_micros(made * 1_000_000 / (RATE + RATE / 2));
        thread::sleep(due.saturating_duration_since(Instant::now()));
    }
    (made, with_task)
}

/// The map named `name` of the tracer `pid`: its own, as other tracers may run beside the test
/// (the soak's smoke bench does).
fn own_map(pid: u32, name: &str) -> aya::maps::MapInfo {
    let own = common::fdinfo_values(pid, "map_id");
    aya::maps::loaded_maps()
        .filter_map(Result::ok)
        .find(|m| m.name_as_str() == Some(name) && own.contains(&u64::from(m.id())))
        .unwrap_or_else(|| panic!("the tracer (pid {pid}) holds no map {name}"))
}

/// The cgroup ids of the open stops in `map`, read from each entry at `id_at`.
fn open_cgroups(map: &aya::maps::MapInfo, id_at: IdAt) -> Vec<u64> {
    let fd = map.fd().expect("open the map");
    entries(&fd, map.key_size(), map.value_size())
        .iter()
        .map(|(key, value)| {
            let (bytes, at) = match id_at {
                IdAt::Key(at) => (key, at),
                IdAt::Value(at) => (value, at),
            };
            u64::from_ne_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
        })
        .collect()
}

/// Where an entry holds its stop's cgroup id: `OPEN_BY_GROUP`'s key (cgroup id, CPU), or the
/// tracepoint backend's open stop, which begins with its record.
#[derive(Clone, Copy)]
enum IdAt {
    Key(usize),
    Value(usize),
}

/// A hash map's entries, walked with `BPF_MAP_GET_NEXT_KEY` and read with
/// `BPF_MAP_LOOKUP_ELEM`; an entry removed during the walk is left out.
fn entries(fd: &impl AsFd, key_size: u32, value_size: u32) -> Vec<(Vec<u8>, Vec<u8>)> {
    /// `union bpf_attr` for the map element commands.
    #[repr(C)]
    struct ElemAttr {
        map_fd: u32,
        _pad: u32,
        key: u64,
        /// `next_key` for GET_NEXT_KEY, `value` for LOOKUP_ELEM.
        out: u64,
        flags: u64,
    }
    const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
    const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
    let bpf = |cmd: libc::c_long, key: Option<&[u8]>, out: &mut [u8]| {
        let mut attr = ElemAttr {
            map_fd: fd.as_fd().as_raw_fd() as u32,
            _pad: 0,
            // NULL: the first key.
            key: key.map_or(0, |k| k.as_ptr() as u64),
            out: out.as_mut_ptr() as u64,
            flags: 0,
        };
        // SAFETY: bpf(2) with an attribute of the size given; the key and output buffers are
        // the map's key and value sizes.
        unsafe {
            libc::syscall(
                libc::SYS_bpf,
                cmd,
                &mut attr as *mut ElemAttr,
                size_of::<ElemAttr>(),
            )
        }
    };
    let mut all = Vec::new();
    let mut key: Option<Vec<u8>> = None;
    loop {
        let mut next = vec![0u8; key_size as usize];
        // The end, or a map changing under the walk (a removed key restarts it): enough.
        if bpf(BPF_MAP_GET_NEXT_KEY, key.as_deref(), &mut next) != 0 || all.len() > 1 << 20 {
            return all;
        }
        let mut value = vec![0u8; value_size as usize];
        if bpf(BPF_MAP_LOOKUP_ELEM, Some(&next), &mut value) == 0 {
            all.push((next.clone(), value));
        }
        key = Some(next);
    }
}

#[test]
fn churning_cgroups_leave_the_live_ones_traced_whole_and_nothing_behind() {
    let Some(host) = common::require(common::host()) else {
        return;
    };
    let cpus = common::last_cpu() + 1;
    let parent = Cgroup::new(&host.cpu, "churn");
    host.cpu.enable_in_children(parent.dir());
    let live: Vec<Cgroup> = (0..2)
        .map(|i| Cgroup::throttled(&host.cpu, &format!("churn-live-{i}"), 20_000, 100_000))
        .collect();
    let churn_for = churn_for();
    let tracer = Tracer::start(&[]);
    let pid = tracer.pid();
    let port = common::http::free_port();
    let mut serve = Running::spawn(
        tracer::command()
            .args([
                "serve",
                "--backend",
                &common::backend(),
                "--gone-after",
                "2s",
                "--listen",
            ])
            .arg(format!("127.0.0.1:{port}"))
            .stdout(Stdio::null()),
    );
    common::http::wait_ready(port, "/metrics", "serve");
    let mut runs: Vec<_> = live
        .iter()
        .enumerate()
        .map(|(i, cg)| {
            let seconds = u32::try_from(churn_for.as_secs() + 2).unwrap();
            common::spawn_in(&mut common::busy(1, seconds), cg, Some(i % cpus))
        })
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let churner = {
        let (cpu, dir, stop) = (host.cpu.clone(), parent.dir().to_owned(), stop.clone());
        thread::spawn(move || churn(&cpu, &dir, &stop))
    };
    let (mut rss, mut serve_rss) = (Vec::new(), Vec::new());
    let started = Instant::now();
    while started.elapsed() < churn_for {
        thread::sleep(Duration::from_secs(1));
        rss.push(rss_kib(pid));
        serve_rss.push(rss_kib(serve.id()));
    }
    stop.store(true, Ordering::Relaxed);
    let (made, with_task) = churner.join().expect("the churn thread");
    let churn_s = started.elapsed().as_secs_f64();
    for run in &mut runs {
        assert!(run.wait().expect("wait for the workload").success());
    }
    let stats: Vec<CpuStat> = live.iter().map(Cgroup::stat).collect();
    let record_id = IdAt::Value(std::mem::offset_of!(tracer_common::StopEvent, cgroup_id));
    let open: Vec<(&str, Vec<u64>)> = [("TP_OPEN", record_id), ("OPEN_BY_GROUP", IdAt::Key(0))]
        .into_iter()
        .map(|(name, at)| (name, open_cgroups(&own_map(pid, name), at)))
        .collect();
    let gone_map = own_map(pid, "GONE");
    let gone_fd = gone_map.fd().expect("open the map");
    let (gone, gone_capacity) = (
        entries(&gone_fd, gone_map.key_size(), gone_map.value_size()).len(),
        gone_map.max_entries(),
    );
    let lines = tracer.stop();

    assert!(
        made as f64 / churn_s >= RATE as f64,
        "{made} cgroups in {churn_s:.1} s"
    );
    for (cgroup, stat) in live.iter().zip(stats) {
        let id = fs::metadata(cgroup.dir()).unwrap().ino();
        let stops = tracer::of(&lines, "stop", id);
        assert_eq!(
            tracer::kernel_ns(&stops),
            stat.throttled_ns,
            "{}: Σ kernel_ns vs its cpu.stat",
            cgroup.path()
        );
        assert_eq!(stops.len() as u64, stat.nr_throttled, "{}", cgroup.path());
    }
    let mut stopped = 0;
    for (id, removed_ns) in &with_task {
        let stops = tracer::of(&lines, "stop", *id);
        stopped += u64::from(!stops.is_empty());
        for s in &stops {
            assert!(
                s["start_ns"].as_u64() < Some(*removed_ns),
                "a stop of churned cgroup {id} began after its removal: {s}"
            );
        }
        for s in tracer::of(&lines, "summary", *id) {
            assert_eq!(s["gone"], true, "{s}");
        }
    }
    assert!(
        stopped * 2 >= with_task.len() as u64,
        "only {stopped} of the {} churned cgroups with a task were seen stopped",
        with_task.len()
    );
    // Nothing of a removed group stays in the maps of open stops, and of the live groups at
    // most their last stop on each CPU. Other cgroups of the machine are traced too (the smoke
    // bench's throttle beside the soak): their stops are theirs.
    let live_ids: Vec<u64> = live
        .iter()
        .map(|cg| fs::metadata(cg.dir()).unwrap().ino())
        .collect();
    for (name, ids) in &open {
        let removed: Vec<&u64> = ids.iter().filter(|id| with_task.contains_key(id)).collect();
        let of_live = ids.iter().filter(|id| live_ids.contains(id)).count();
        println!(
            "{name} after the churn: {} open, {of_live} of the live groups, {} of removed ones",
            ids.len(),
            removed.len()
        );
        assert!(
            removed.is_empty(),
            "{name} holds removed cgroups {removed:?}"
        );
        assert!(
            of_live <= live.len() * cpus,
            "{name}: {of_live} of the live groups"
        );
    }
    // The map of removed cgroups is bounded by its capacity, and what it evicted is counted:
    // every cgroup removed here was inserted, so at least those beyond its capacity went.
    let end = lines.last().expect("an end line");
    assert_eq!(end["type"], "end", "{end}");
    let evicted = end["evicted_removed_cgroups"]
        .as_u64()
        .unwrap_or_else(|| panic!("no evicted_removed_cgroups: {end}"));
    println!(
        "removed cgroups: {gone} of {gone_capacity} in the map at the end, {evicted} evicted \
         (at least {} of the {made} removed here); paths forgotten: {}",
        made.saturating_sub(u64::from(gone_capacity)),
        end["forgotten_paths"]
    );
    assert!(gone <= gone_capacity as usize, "{gone} > {gone_capacity}");
    assert!(
        evicted >= made.saturating_sub(u64::from(gone_capacity)),
        "{evicted} evicted, {made} removed into a map of {gone_capacity}: {end}"
    );
    let warm_at = (rss.len() / 3).max(10).min(rss.len() - 1);
    let warm = rss[warm_at];
    let last = *rss.last().unwrap();
    println!(
        "{made} cgroups made and removed in {churn_s:.1} s ({:.0}/s), {} with a task ({stopped} \
         seen stopped); tracer RSS {warm} KiB after warm-up, {last} KiB at the end: {rss:?}",
        made as f64 / churn_s,
        with_task.len()
    );
    // A plain run keeps the summary of every cgroup that stopped (the report lists each):
    // that much may grow with the churned cgroups seen stopped, nothing else may.
    let allowed = warm * 105 / 100 + stopped * SUMMARY_KIB;
    assert!(
        last <= allowed,
        "the tracer's memory grew from {warm} to {last} KiB (allowed {allowed} KiB with \
         {stopped} stopped cgroups' summaries): {rss:?}"
    );
    let (serve_warm, serve_last) = (serve_rss[warm_at], *serve_rss.last().unwrap());
    println!(
        "serve RSS {serve_warm} KiB after warm-up, {serve_last} KiB at the end: {serve_rss:?}"
    );
    assert!(
        serve_last <= serve_warm * 105 / 100,
        "serve's memory grew from {serve_warm} to {serve_last} KiB: {serve_rss:?}"
    );
    assert!(serve.interrupt().success(), "serve's exit");
}
