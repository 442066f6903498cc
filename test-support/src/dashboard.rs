//! deploy/grafana/throttle-tracer.json as the tests read it: checked against Grafana's own schema
//! types ([`schema_check`]: Grafana itself cannot be installed here) and by hand against what
//! Grafana 10+ needs to draw it (`Dashboard::check`), and each panel target's PromQL with the
//! dashboard's variables filled in, to be run against a real Prometheus.
use std::{
    collections::HashSet,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use serde::Deserialize;
use serde_json::Value;

/// The panel types the dashboard may use, all built into Grafana 10; a `row` titles the panels
/// below it, down to the next row.
const PANEL_TYPES: &[&str] = &["timeseries", "heatmap", "table", "bargauge", "stat", "row"];
/// Grafana's own variables that the expressions may use, and what the tests put for them: a
/// step that covers several 1 s scrapes and a range that covers the whole test.
const BUILT_INS: &[(&str, &str)] = &[("$__rate_interval", "5s"), ("$__range", "5m")];

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Dashboard {
    pub title: String,
    pub uid: String,
    pub schema_version: u32,
    pub templating: Templating,
    pub panels: Vec<Panel>,
    pub time: Value,
}

#[derive(Debug, Deserialize)]
pub struct Templating {
    pub list: Vec<Variable>,
}

#[derive(Debug, Deserialize)]
pub struct Variable {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub query: Value,
    pub datasource: Option<Datasource>,
}

#[derive(Debug, Deserialize, PartialEq, Eq)]
pub struct Datasource {
    #[serde(rename = "type")]
    pub kind: String,
    pub uid: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Panel {
    pub id: u32,
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    /// None on a row only.
    pub datasource: Option<Datasource>,
    pub grid_pos: GridPos,
    #[serde(default)]
    pub targets: Vec<Target>,
    #[serde(default)]
    pub field_config: serde_json::Map<String, Value>,
    #[serde(default)]
    pub options: serde_json::Map<String, Value>,
    /// A row's: false, as Grafana keeps an open row's panels after it in the list.
    pub collapsed: Option<bool>,
    /// A collapsed row's panels; an open row has none.
    #[serde(default)]
    pub panels: Vec<Value>,
}

#[derive(Debug, Deserialize)]
pub struct GridPos {
    pub h: u32,
    pub w: u32,
    pub x: u32,
    pub y: u32,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Target {
    pub ref_id: String,
    pub expr: String,
    pub datasource: Datasource,
    #[serde(default)]
    pub instant: bool,
}

fn path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/throttle-tracer.json")
}

/// The dashboard, checked by hand (see the module's doc); panics saying what is wrong.
pub fn load() -> Dashboard {
    let path = path();
    let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let d: Dashboard = serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "{}: not a dashboard of the expected shape: {e}",
            path.display()
        )
    });
    d.check();
    d
}

/// tsc's verdict on the dashboard as an object literal of Grafana's schema types for 10.1 and
/// 11.6 (deploy/grafana/schema/schema.ts), in the npm project `cargo xtask setup host-tests`
/// installs under target/grafana-schema: `Ok(Ok(summary))` when it type-checks, `Ok(Err(tsc's
/// errors))` when it does not, `Err` when tsc is not installed.
pub fn schema_check() -> Result<Result<String, String>, String> {
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"),
        PathBuf::from,
    );
    let project = target.join("grafana-schema");
    let tsc = project.join("node_modules/.bin/tsc");
    if !tsc.exists() {
        return Err(format!(
            "no {}: run `cargo xtask setup host-tests`",
            tsc.display()
        ));
    }
    let schema = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/schema");
    for file in ["schema.ts", "tsconfig.json"] {
        fs::copy(schema.join(file), project.join(file)).expect("copy the schema's files");
    }
    let json = fs::read_to_string(path()).expect("read the dashboard");
    fs::write(
        project.join("dashboard.gen.ts"),
        format!(
            "import type {{ Grafana10, Grafana11 }} from \"./schema\";\n\
             export const grafana10: Grafana10 = {json};\n\
             export const grafana11: Grafana11 = {json};\n"
        ),
    )
    .expect("write dashboard.gen.ts");
    let out = Command::new(&tsc)
        .args(["-p", "."])
        .current_dir(&project)
        .output()
        .expect("run tsc");
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    Ok(if out.status.success() {
        Ok(format!("tsc {} accepts it", project.display()))
    } else {
        Err(said)
    })
}

impl Dashboard {
    /// The hand check: `schemaVersion` ≥ 36 (Grafana 9.0+; 10.x writes 37–39), a `uid`, a
    /// title; a `datasource` variable of type prometheus that every query variable uses; panels
    /// with unique ids, known types, titles, and `gridPos`es inside the 24-column grid that
    /// overlap none; rows open (their panels follow them in the list), full width, one unit
    /// high, without queries; every other panel on the datasource variable, with at least one
    /// target, each with a unique `refId`, a non-empty `expr` on that datasource and no variable
    /// but the dashboard's own and Grafana's built-ins. Field configs and options: objects only.
    fn check(&self) {
        assert!(
            self.schema_version >= 36,
            "schemaVersion {}",
            self.schema_version
        );
        assert!(!self.uid.is_empty() && !self.title.is_empty());
        assert!(self.time["from"].is_string() && self.time["to"].is_string());
        let source = Datasource {
            kind: "prometheus".into(),
            uid: "${datasource}".into(),
        };
        let variables: Vec<&str> = self
            .templating
            .list
            .iter()
            .map(|v| v.name.as_str())
            .collect();
        let datasource = self
            .templating
            .list
            .iter()
            .find(|v| v.name == "datasource")
            .expect("a datasource variable");
        assert_eq!(
            (datasource.kind.as_str(), datasource.query.as_str()),
            ("datasource", Some("prometheus"))
        );
        for v in self.templating.list.iter().filter(|v| v.kind == "query") {
            assert_eq!(v.datasource.as_ref(), Some(&source), "variable {}", v.name);
            assert!(v.query["query"].is_string(), "variable {}", v.name);
        }
        let mut ids = HashSet::new();
        let mut cells = HashSet::new();
        for p in &self.panels {
            let what = format!("panel {} ({})", p.id, p.title);
            assert!(ids.insert(p.id), "{what}: id used twice");
            assert!(
                PANEL_TYPES.contains(&p.kind.as_str()),
                "{what}: type {}",
                p.kind
            );
            assert!(!p.title.is_empty(), "{what}: no title");
            let g = &p.grid_pos;
            assert!(
                g.w > 0 && g.h > 0 && g.x + g.w <= 24,
                "{what}: gridPos {g:?}"
            );
            for x in g.x..g.x + g.w {
                for y in g.y..g.y + g.h {
                    assert!(
                        cells.insert((x, y)),
                        "{what}: overlaps another panel at {x},{y}"
                    );
                }
            }
            if p.kind == "row" {
                assert_eq!(p.collapsed, Some(false), "{what}: a row must be open");
                assert!(p.panels.is_empty(), "{what}: an open row holds no panels");
                assert!(
                    p.targets.is_empty() && p.datasource.is_none(),
                    "{what}: a row has no queries"
                );
                assert_eq!((g.x, g.w, g.h), (0, 24, 1), "{what}: a row spans the grid");
                continue;
            }
            assert_eq!(p.datasource.as_ref(), Some(&source), "{what}");
            assert!(!p.targets.is_empty(), "{what}: no targets");
            let mut refs = HashSet::new();
            for t in &p.targets {
                assert!(refs.insert(&t.ref_id), "{what}: refId {} twice", t.ref_id);
                assert!(!t.expr.trim().is_empty(), "{what}: empty expr");
                assert_eq!(t.datasource, source, "{what} {}", t.ref_id);
                let mut rest = t.expr.as_str();
                while let Some(at) = rest.find('$') {
                    let name: String = rest[at + 1..]
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    let known = variables.contains(&name.as_str())
                        || BUILT_INS.iter().any(|(b, _)| b[1..] == name);
                    assert!(known, "{what} {}: unknown variable ${name}", t.ref_id);
                    rest = &rest[at + 1..];
                }
            }
        }
    }

    /// The panels of the open row titled `title`: those after it in the list down to the next
    /// row, each placed below it.
    pub fn row(&self, title: &str) -> Vec<&Panel> {
        let at = self
            .panels
            .iter()
            .position(|p| p.kind == "row" && p.title == title)
            .unwrap_or_else(|| panic!("no row \"{title}\""));
        let top = self.panels[at].grid_pos.y;
        let inside: Vec<&Panel> = self.panels[at + 1..]
            .iter()
            .take_while(|p| p.kind != "row")
            .collect();
        for p in &inside {
            assert!(
                p.grid_pos.y > top,
                "panel {} ({}) is above its row \"{title}\"",
                p.id,
                p.title
            );
        }
        inside
    }

    /// Every panel's targets: (panel title, refId, PromQL with `$instance` and `$cgroup` set to
    /// `instance` and `cgroup` (as regexes), Grafana's built-ins to the test's steps).
    pub fn queries(&self, instance: &str, cgroup: &str) -> Vec<(String, String, String)> {
        let mut out = Vec::new();
        for p in &self.panels {
            for t in &p.targets {
                let mut expr = t.expr.replace("$instance", &regex_quote(instance));
                expr = expr.replace("$cgroup", &regex_quote(cgroup));
                for (name, value) in BUILT_INS {
                    expr = expr.replace(name, value);
                }
                out.push((p.title.clone(), t.ref_id.clone(), expr));
            }
        }
        out
    }

    /// The query variables' `label_values(<selector>, <label>)` queries, with the variables
    /// they use filled in as [`Dashboard::queries`] does: (variable, selector, label).
    pub fn label_values(&self, instance: &str) -> Vec<(String, String, String)> {
        self.templating
            .list
            .iter()
            .filter(|v| v.kind == "query")
            .map(|v| {
                let q = v.query["query"].as_str().unwrap();
                let inner = q
                    .strip_prefix("label_values(")
                    .and_then(|q| q.strip_suffix(')'))
                    .unwrap_or_else(|| panic!("variable {}: {q}", v.name));
                let (selector, label) = inner.rsplit_once(',').unwrap();
                let selector = selector.replace("$instance", &regex_quote(instance));
                (v.name.clone(), selector, label.trim().to_owned())
            })
            .collect()
    }
}

/// `s` as a PromQL regex that matches only `s` (inside a double-quoted string).
fn regex_quote(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            '.' | '+' | '*' | '?' | '(' | ')' | '[' | ']' | '{' | '}' | '|' | '^' | '$' => {
                format!("\\\\{c}")
            }
            c => c.to_string(),
        })
        .collect()
}
