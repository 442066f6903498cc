//! deploy/: the DaemonSet manifest has the structure the exporter needs (kind, `serve` args
//! that the binary accepts, one port for listening, the container and its startup, readiness
//! and liveness probes on /healthz, exactly the documented capabilities, the host cgroup and BTF
//! mounts read-only), and the Dockerfile is the static binary and /etc/passwd `FROM scratch`,
//! exposing that port (tracer/tests/image.rs runs it). The Grafana dashboard is valid by
//! Grafana's own schema for 10.1 and 11.6, has the shape Grafana 10+ draws (test-support/src/dashboard.rs
//! says what is checked) and the panels the README promises, its row "What to set" among them,
//! and every recorded series it queries is one deploy/prometheus/rules.yaml records;
//! tracer/tests/prometheus.rs runs its queries.
use test_support as common;

use std::{fs, path::Path};

use yaml_rust2::{Yaml, YamlLoader};

fn deploy(file: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(file);
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn manifest() -> Yaml {
    let docs = YamlLoader::load_from_str(&deploy("daemonset.yaml")).expect("valid YAML");
    assert_eq!(docs.len(), 1, "one document");
    docs.into_iter().next().unwrap()
}

fn str_of<'a>(y: &'a Yaml, what: &str) -> &'a str {
    y.as_str()
        .unwrap_or_else(|| panic!("{what} is not a string: {y:?}"))
}

fn strings(y: &Yaml, what: &str) -> Vec<String> {
    y.as_vec()
        .unwrap_or_else(|| panic!("{what} is not a list: {y:?}"))
        .iter()
        .map(|s| str_of(s, what).to_owned())
        .collect()
}

/// The one container of the pod template.
fn container(m: &Yaml) -> &Yaml {
    let containers = m["spec"]["template"]["spec"]["containers"]
        .as_vec()
        .expect("containers");
    assert_eq!(containers.len(), 1, "one container");
    &containers[0]
}

/// The port of `--listen ADDR:PORT` in the container's args, and the address.
fn listen(c: &Yaml) -> (String, i64) {
    let args = strings(&c["args"], "args");
    let at = args
        .iter()
        .position(|a| a == "--listen")
        .unwrap_or_else(|| panic!("no --listen in {args:?}"));
    let (addr, port) = args[at + 1]
        .rsplit_once(':')
        .unwrap_or_else(|| panic!("--listen {} is not ADDR:PORT", args[at + 1]));
    (addr.to_owned(), port.parse().expect("a port number"))
}

#[test]
fn daemonset_runs_serve_on_one_port_with_probes() {
    let m = manifest();
    assert_eq!(str_of(&m["apiVersion"], "apiVersion"), "apps/v1");
    assert_eq!(str_of(&m["kind"], "kind"), "DaemonSet");
    let template = &m["spec"]["template"];
    assert_eq!(
        m["spec"]["selector"]["matchLabels"], template["metadata"]["labels"],
        "the selector matches the pod labels"
    );
    let c = container(&m);
    let args = strings(&c["args"], "args");
    assert_eq!(args[0], "serve", "{args:?}");
    let (addr, port) = listen(c);
    assert_eq!(addr, "0.0.0.0", "must be scrapeable from outside the pod");

    let ports = c["ports"].as_vec().expect("ports");
    assert_eq!(ports.len(), 1);
    assert_eq!(ports[0]["containerPort"].as_i64(), Some(port));
    assert_eq!(str_of(&ports[0]["protocol"], "protocol"), "TCP");
    // /healthz is 503 until the probes are attached, 200 after (tracer/tests/serve_selection.rs).
    for (probe, path) in [
        ("startupProbe", "/healthz"),
        ("readinessProbe", "/healthz"),
        ("livenessProbe", "/healthz"),
    ] {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["port"].as_i64(), Some(port), "{probe} port");
        assert_eq!(str_of(&get["path"], probe), path, "{probe} path");
    }
    let annotations = &template["metadata"]["annotations"];
    assert_eq!(
        str_of(&annotations["prometheus.io/port"], "annotation"),
        port.to_string()
    );
    assert_eq!(
        str_of(&annotations["prometheus.io/path"], "annotation"),
        "/metrics"
    );
}

#[test]
fn daemonset_asks_for_exactly_the_documented_privileges() {
    let m = manifest();
    let pod = &m["spec"]["template"]["spec"];
    for host in ["hostPID", "hostNetwork", "hostIPC"] {
        assert_ne!(pod[host].as_bool(), Some(true), "{host} is not needed");
    }
    let sc = &container(&m)["securityContext"];
    assert_ne!(sc["privileged"].as_bool(), Some(true));
    assert_eq!(sc["allowPrivilegeEscalation"].as_bool(), Some(false));
    assert_eq!(sc["readOnlyRootFilesystem"].as_bool(), Some(true));
    assert_eq!(strings(&sc["capabilities"]["drop"], "drop"), ["ALL"]);
    // CAP_BPF and CAP_PERFMON (kernel 5.8+); not SYS_RESOURCE (5.11+ charges BPF memory to
    // the memory cgroup), not SYS_ADMIN (only before 5.8). The comments say so.
    let mut add = strings(&sc["capabilities"]["add"], "add");
    add.sort();
    assert_eq!(add, ["BPF", "PERFMON"]);
    let text = deploy("daemonset.yaml");
    for documented in [
        "CAP_BPF",
        "CAP_PERFMON",
        "CAP_SYS_RESOURCE",
        "CAP_SYS_ADMIN",
        "5.8",
    ] {
        assert!(
            text.contains(documented),
            "the comments explain {documented}"
        );
    }
}

#[test]
fn daemonset_mounts_host_cgroups_and_btf_read_only() {
    let m = manifest();
    let pod = &m["spec"]["template"]["spec"];
    let volumes = pod["volumes"].as_vec().expect("volumes");
    let mounts = container(&m)["volumeMounts"]
        .as_vec()
        .expect("volumeMounts");
    for path in ["/sys/fs/cgroup", "/sys/kernel/btf"] {
        let mount = mounts
            .iter()
            .find(|v| v["mountPath"].as_str() == Some(path))
            .unwrap_or_else(|| panic!("no mount at {path}"));
        assert_eq!(mount["readOnly"].as_bool(), Some(true), "{path} read-only");
        let name = str_of(&mount["name"], "mount name");
        let volume = volumes
            .iter()
            .find(|v| v["name"].as_str() == Some(name))
            .unwrap_or_else(|| panic!("no volume {name}"));
        assert_eq!(
            str_of(&volume["hostPath"]["path"], "hostPath"),
            path,
            "{name} is the host's own {path}"
        );
    }
}

/// The manifest's args are a command line the binary accepts: with `--max-cgroups 0` added,
/// it gets past the argument parser and stops at its own check, before tracing anything.
#[test]
fn daemonset_args_parse() {
    let m = manifest();
    let args = strings(&container(&m)["args"], "args");
    let out = common::tracer::command()
        .args(&args)
        .args(["--max-cgroups", "0"])
        .output()
        .expect("run throttle-tracer");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--max-cgroups 0 would export no cgroup"),
        "the args did not parse: {stderr}"
    );
}

/// The image holds the static binary and /etc/passwd, nothing else: no base image to pull, no
/// build stage (`cargo xtask image` builds the binary and hands this file a context of the two).
#[test]
fn dockerfile_is_the_static_binary_from_scratch_and_exposes_the_port() {
    let text = deploy("Dockerfile");
    let instructions: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .collect();
    let froms: Vec<&&str> = instructions
        .iter()
        .filter(|l| l.starts_with("FROM "))
        .collect();
    assert_eq!(froms, [&"FROM scratch"]);
    let copies: Vec<&&str> = instructions
        .iter()
        .filter(|l| l.starts_with("COPY "))
        .collect();
    assert_eq!(
        copies,
        [
            &"COPY passwd /etc/passwd",
            &"COPY throttle-tracer /usr/local/bin/throttle-tracer"
        ]
    );
    assert!(!instructions.iter().any(|l| l.starts_with("RUN ")));
    assert!(deploy("passwd").starts_with("root:x:0:0:"));
    let (_, port) = listen(container(&manifest()));
    assert!(text.contains(&format!("EXPOSE {port}\n")), "EXPOSE {port}");
}

/// Grafana's schema, as the types Grafana's Foundation SDK generates from it for 10.1 and 11.6:
/// every field the dashboard writes is one the schema names, with a value of its type (11.6's
/// required fields present; 10.1's may be left to the defaults Grafana fills in).
#[test]
fn grafana_dashboard_is_valid_by_grafanas_own_schema_10_and_11() {
    let Some(verdict) = common::require(common::dashboard::schema_check()) else {
        return;
    };
    match verdict {
        Ok(summary) => println!("{summary}"),
        Err(errors) => {
            panic!("deploy/grafana/throttle-tracer.json against Grafana's schema:\n{errors}")
        }
    }
}

#[test]
fn grafana_dashboard_has_the_shape_grafana_imports_and_every_promised_panel() {
    let d = common::dashboard::load();
    let exprs: Vec<String> = d.queries("n", "/c").into_iter().map(|q| q.2).collect();
    let uses = |needle: &str| exprs.iter().any(|e| e.contains(needle));
    assert!(
        d.panels.iter().any(|p| p.kind == "heatmap"),
        "a stop-length heatmap"
    );
    for needle in [
        "histogram_quantile(0.5,",
        "histogram_quantile(0.99,",
        "histogram_quantile(1,",
        "throttle_tracer_cpu_stop_seconds{",
        "throttle_tracer_cpu_stop_seconds_bucket{",
        "throttle_tracer_cpu_stopped_seconds_total",
        "throttle_tracer_wall_stopped_seconds_total",
        "throttle_tracer_cpustat_throttled_seconds_total",
        "topk(",
        "throttle_tracer_lost_records_total",
    ] {
        assert!(uses(needle), "no panel queries {needle}");
    }
    println!(
        "{} panels, {} targets, schemaVersion {}",
        d.panels.len(),
        exprs.len(),
        d.schema_version
    );
}

/// The `record` names of deploy/prometheus/rules.yaml.
fn recorded() -> Vec<String> {
    let docs = YamlLoader::load_from_str(&deploy("prometheus/rules.yaml")).expect("valid YAML");
    let groups = docs[0]["groups"].as_vec().expect("groups");
    groups
        .iter()
        .flat_map(|g| g["rules"].as_vec().expect("rules"))
        .filter_map(|r| r["record"].as_str().map(str::to_owned))
        .collect()
}

/// The row "What to set" draws today's limit against the p99 period demand and the advice, and
/// lists the containers to change; each `cgroup:…` series a query names is recorded by
/// rules.yaml (a misspelt one would draw nothing, without an error).
#[test]
fn grafana_dashboard_what_to_set_row_queries_recorded_series() {
    let d = common::dashboard::load();
    let row = d.row("What to set");
    let exprs = |kind: &str| -> Vec<String> {
        row.iter()
            .filter(|p| p.kind == kind)
            .flat_map(|p| p.targets.iter().map(|t| t.expr.clone()))
            .collect()
    };
    let over_time = exprs("timeseries");
    for needle in [
        "cgroup:throttle_tracer_limit_millicores:current{",
        "cgroup:throttle_tracer_period_demand_millicores:p99_rate5m{",
        "cgroup:throttle_tracer_period_demand_millicores:p99_native_rate5m{",
        "cgroup:throttle_tracer_advised_limit_millicores:current{",
    ] {
        assert!(
            over_time.iter().any(|e| e.contains(needle)),
            "no time series panel of the row queries {needle}"
        );
    }
    let table = exprs("table");
    assert!(
        table
            .iter()
            .any(|e| e.contains("cgroup:throttle_tracer_limit_change_millicores:advised7d")),
        "no table of the row lists the containers to change: {table:?}"
    );
    let records = recorded();
    let prefix = "cgroup:throttle_tracer_";
    let mut named = Vec::new();
    for (panel, ref_id, expr) in d.queries("n", "/c") {
        for (at, _) in expr.match_indices(prefix) {
            let name: String = expr[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            assert!(
                records.contains(&name),
                "{panel} {ref_id}: {name} is not recorded by rules.yaml ({records:?})"
            );
            named.push(name);
        }
    }
    named.sort();
    named.dedup();
    println!(
        "the dashboard queries {} recorded series: {named:?}",
        named.len()
    );
}
