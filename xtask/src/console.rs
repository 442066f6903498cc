//! Reading the guest's console: `@@TT KIND ...` marker lines and the sections between
//! `@@TT BEGIN name` and `@@TT END name` (see guest/prelude.sh).
use std::collections::HashMap;

const MARK: &str = "@@TT ";

/// How the kernel reports that something went wrong in it (the console shows messages up to
/// KERN_WARNING: qemu.rs boots with loglevel=5).
const KERNEL_TROUBLE: &[&str] = &[
    "Kernel panic",
    "BUG:",
    "Oops",
    "WARNING:",
    "watchdog:",
    "rcu: INFO:",
    "detected stalls",
];
/// Lines of a kernel report kept from its first line: the splat, its registers and trace.
const TROUBLE_LINES: usize = 40;

#[derive(Default)]
pub struct Console {
    sections: HashMap<String, Vec<String>>,
    /// Marker lines other than BEGIN/END, without the prefix.
    marks: Vec<String>,
    /// The kernel's first report of trouble and the lines after it.
    trouble: Vec<String>,
}

impl Console {
    pub fn parse(text: &str) -> Self {
        let mut console = Self::default();
        let mut open: Option<(String, Vec<String>)> = None;
        for line in text.lines() {
            if console.trouble.len() < TROUBLE_LINES
                && (!console.trouble.is_empty() || KERNEL_TROUBLE.iter().any(|k| line.contains(k)))
            {
                console.trouble.push(line.to_owned());
            }
            // Markers may follow terminal escapes the firmware left on the same line.
            match line.find(MARK).map(|at| &line[at + MARK.len()..]) {
                Some(rest) => {
                    if let Some(name) = rest.strip_prefix("BEGIN ") {
                        open = Some((name.to_owned(), Vec::new()));
                    } else if let Some(name) = rest.strip_prefix("END ") {
                        if let Some((open_name, lines)) = open.take()
                            && open_name == name
                        {
                            console.sections.insert(open_name, lines);
                        }
                    } else {
                        console.marks.push(rest.to_owned());
                    }
                }
                None => {
                    if let Some((_, lines)) = &mut open
                        && !line.is_empty()
                    {
                        lines.push(line.to_owned());
                    }
                }
            }
        }
        console
    }

    /// A section's non-empty lines; `None` if the guest never finished printing it.
    pub fn section(&self, name: &str) -> Option<&[String]> {
        self.sections.get(name).map(Vec::as_slice)
    }

    /// The kernel's first panic, oops, warning, lockup or stall report, with what followed it;
    /// empty if it printed none. Any of them fails a boot: the tracer must not upset the kernel.
    pub fn kernel_trouble(&self) -> &[String] {
        &self.trouble
    }

    /// The text after `KIND ` of the first marker of that kind whose next word is `name`
    /// (or of the first marker of that kind when `name` is empty).
    pub fn mark(&self, kind: &str, name: &str) -> Option<&str> {
        self.marks.iter().find_map(|m| {
            let rest = m.strip_prefix(kind)?.strip_prefix(' ')?;
            if name.is_empty() {
                return Some(rest);
            }
            rest.strip_prefix(name)
                .and_then(|r| r.strip_prefix(' '))
                .or_else(|| (rest == name).then_some(""))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_and_marks() {
        let text = "boot noise\n\x1bc@@TT UNAME 6.1.0-47-cloud-amd64\n@@TT BEGIN s1/x\nline 1\n\n\
                    line 2\n@@TT END s1/x\n@@TT TRACER s1 exit status 0\n@@TT BEGIN s2/x\ncut";
        let console = Console::parse(text);
        assert_eq!(console.section("s1/x").unwrap(), ["line 1", "line 2"]);
        assert!(console.section("s2/x").is_none());
        assert_eq!(console.mark("UNAME", ""), Some("6.1.0-47-cloud-amd64"));
        assert_eq!(console.mark("TRACER", "s1"), Some("exit status 0"));
        assert_eq!(console.mark("TRACER", "s2"), None);
        assert!(console.kernel_trouble().is_empty());
    }

    #[test]
    fn kernel_trouble_keeps_the_report() {
        let text = "@@TT SCENARIO s2\nwatchdog: BUG: soft lockup - CPU#0 stuck for 45s!\n\
                    RIP: 0010:smp_call_function_many_cond\n@@TT TRACER s2 exit status 0";
        let trouble = Console::parse(text).kernel_trouble().to_vec();
        assert_eq!(trouble.len(), 3);
        assert!(trouble[0].starts_with("watchdog:"));
        assert!(trouble[1].starts_with("RIP:"));
    }
}
