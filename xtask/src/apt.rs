//! apt for Debian suites the system does not list (bullseye-security, sid, backports, ...).
//!
//! The archive URIs come from the system's own deb822 sources, so no mirror is named here.
//! [`PrivateApt`] downloads one architecture's packages from one suite with its lists, cache
//! and sources under `target/vm/apt/<architecture>/<suite>/` and never touches the system's
//! apt state; [`WithSuite`] installs into the system from its own sources plus one more suite,
//! with only the lists kept apart.
use crate::arch::Arch;
use crate::cmd;
use anyhow::{Context as _, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

const SYSTEM_SOURCES: &str = "/etc/apt/sources.list.d/debian.sources";

/// Which of Debian's two archives carries a suite.
#[derive(Clone, Copy)]
pub enum Archive {
    /// `.../debian`: bookworm, sid, ...
    Main,
    /// `.../debian-security`: bookworm-security, bullseye-security, ...
    Security,
}

/// apt restricted to one suite of one archive, and to one architecture's packages (the
/// guest's, which need not be this machine's).
pub struct PrivateApt {
    dir: PathBuf,
    arch: Arch,
}

impl PrivateApt {
    pub fn new(suite: &str, archive: Archive, arch: Arch) -> Result<Self> {
        let dir = crate::paths::vm()
            .join("apt")
            .join(arch.debian())
            .join(suite);
        for sub in ["lists/partial", "cache/archives/partial"] {
            std::fs::create_dir_all(dir.join(sub))?;
        }
        let source = system_source(archive)?;
        let options = match &source.signed_by {
            Some(keyring) => format!("[signed-by={keyring}] "),
            None => String::new(),
        };
        let line = format!("deb {options}{} {suite} main\n", source.uri);
        std::fs::write(dir.join("sources.list"), line)?;
        Ok(Self { dir, arch })
    }

    /// Downloads the package lists unless a previous run already did.
    pub fn update_once(&self) -> Result<()> {
        let have_lists = std::fs::read_dir(self.dir.join("lists"))?
            .filter_map(|e| e.ok())
            .any(|e| e.file_name().to_string_lossy().ends_with("_Packages"));
        if have_lists { Ok(()) } else { self.update() }
    }

    pub fn update(&self) -> Result<()> {
        cmd::run(self.command("apt-get").args(["-q", "update"]))
    }

    /// Package names matching the extended regular expression `regex`.
    pub fn search(&self, regex: &str) -> Result<Vec<String>> {
        let out = cmd::stdout(
            self.command("apt-cache")
                .args(["search", "--names-only", regex]),
        )?;
        Ok(out
            .lines()
            .filter_map(|l| l.split(" - ").next())
            .map(str::to_owned)
            .collect())
    }

    /// Downloads `package` into `into` and returns the .deb's path.
    pub fn download(&self, package: &str, into: &Path) -> Result<PathBuf> {
        cmd::run(
            self.command("apt-get")
                .args(["-q", "download", package])
                .current_dir(into),
        )?;
        let prefix = format!("{package}_");
        std::fs::read_dir(into)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| {
                let name = p.file_name().unwrap_or_default().to_string_lossy();
                name.starts_with(&prefix) && name.ends_with(".deb")
            })
            .with_context(|| format!("apt-get download left no {package}_*.deb"))
    }

    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        let dir = |sub: &str| self.dir.join(sub).display().to_string();
        for (key, value) in [
            ("Dir::Etc::sourcelist", dir("sources.list")),
            ("Dir::Etc::sourceparts", "/dev/null".to_owned()),
            ("Dir::State::Lists", dir("lists")),
            ("Dir::Cache", dir("cache")),
            ("Dir::State::status", "/dev/null".to_owned()),
            ("Acquire::Languages", "none".to_owned()),
            ("APT::Architecture", self.arch.debian().to_owned()),
            ("APT::Architectures", self.arch.debian().to_owned()),
            // Files go to target/, which apt's unprivileged _apt user may not write.
            ("APT::Sandbox::User", "root".to_owned()),
        ] {
            cmd.arg("-o").arg(format!("{key}={value}"));
        }
        cmd
    }
}

/// The system's sources plus one suite they lack: the packages it installs come from the
/// system's archives and that suite, into the system's dpkg; its lists live under
/// `target/vm/apt/with-<suite>/`, so the system's own lists stay as they were.
pub struct WithSuite {
    dir: PathBuf,
}

impl WithSuite {
    pub fn new(suite: &str) -> Result<Self> {
        let dir = crate::paths::vm().join("apt").join(format!("with-{suite}"));
        for sub in ["lists/partial", "parts"] {
            std::fs::create_dir_all(dir.join(sub))?;
        }
        let system = std::fs::read_to_string(SYSTEM_SOURCES)
            .with_context(|| format!("reading {SYSTEM_SOURCES} (deb822 apt sources)"))?;
        let source = system_source(Archive::Main)?;
        let mut stanza = format!(
            "Types: deb\nURIs: {}\nSuites: {suite}\nComponents: main\n",
            source.uri
        );
        if let Some(keyring) = &source.signed_by {
            stanza.push_str(&format!("Signed-By: {keyring}\n"));
        }
        std::fs::write(dir.join("parts/system.sources"), system)?;
        std::fs::write(dir.join("parts/extra.sources"), stanza)?;
        Ok(Self { dir })
    }

    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        let dir = |sub: &str| self.dir.join(sub).display().to_string();
        for (key, value) in [
            ("Dir::Etc::sourcelist", "/dev/null".to_owned()),
            ("Dir::Etc::sourceparts", dir("parts")),
            ("Dir::State::Lists", dir("lists")),
            ("APT::Sandbox::User", "root".to_owned()),
        ] {
            cmd.arg("-o").arg(format!("{key}={value}"));
        }
        cmd
    }
}

/// Every suite the system's apt sources list.
pub fn system_suites() -> Result<Vec<String>> {
    let text = std::fs::read_to_string(SYSTEM_SOURCES)
        .with_context(|| format!("reading {SYSTEM_SOURCES} (deb822 apt sources)"))?;
    Ok(suites(&text))
}

fn suites(deb822: &str) -> Vec<String> {
    deb822
        .lines()
        .filter_map(|l| l.strip_prefix("Suites:"))
        .flat_map(|v| v.split_whitespace().map(str::to_owned))
        .collect()
}

/// One archive as the system's apt sources name it.
struct Source {
    uri: String,
    signed_by: Option<String>,
}

fn system_source(archive: Archive) -> Result<Source> {
    let text = std::fs::read_to_string(SYSTEM_SOURCES)
        .with_context(|| format!("reading {SYSTEM_SOURCES} (deb822 apt sources)"))?;
    find_source(&text, archive).with_context(|| {
        let which = match archive {
            Archive::Main => "Debian's main archive",
            Archive::Security => "Debian's security archive",
        };
        format!("{SYSTEM_SOURCES} has no stanza for {which}")
    })
}

/// The stanza whose suites are all `-security` ones (or none of them), for the archive asked.
fn find_source(deb822: &str, archive: Archive) -> Option<Source> {
    deb822.split("\n\n").find_map(|stanza| {
        let field = |name: &str| {
            stanza
                .lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .map(|v| v.trim().to_owned())
        };
        let suites = field("Suites")?;
        let security = suites.split_whitespace().all(|s| s.ends_with("-security"));
        let wanted = match archive {
            Archive::Main => !security,
            Archive::Security => security,
        };
        if !wanted {
            return None;
        }
        let uri = field("URIs")?.split_whitespace().next()?.to_owned();
        Some(Source {
            uri,
            signed_by: field("Signed-By"),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOURCES: &str = "Types: deb\n# a comment\nURIs: http://mirror.example/debian\n\
        Suites: bookworm bookworm-updates\nComponents: main\nSigned-By: /k.gpg\n\n\
        Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n\
        Components: main\n";

    #[test]
    fn finds_both_archives() {
        let main = find_source(SOURCES, Archive::Main).unwrap();
        assert_eq!(main.uri, "http://mirror.example/debian");
        assert_eq!(main.signed_by.as_deref(), Some("/k.gpg"));
        let security = find_source(SOURCES, Archive::Security).unwrap();
        assert_eq!(security.uri, "http://mirror.example/debian-security");
        assert_eq!(security.signed_by, None);
    }

    #[test]
    fn lists_every_suite() {
        assert_eq!(
            suites(SOURCES),
            ["bookworm", "bookworm-updates", "bookworm-security"]
        );
    }
}
