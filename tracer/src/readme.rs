//! The README read as a newcomer reads it: every `throttle-tracer …` command in its `sh` code
//! blocks, with or without `sudo`, parses with the program's own command line, so that a flag
//! the README names and the program lacks fails here. `cargo xtask …` commands are xtask's to
//! check (xtask/src/readme.rs).
use clap::Parser as _;

use crate::cli::Options;

const README: &str = include_str!("../../README.md");

/// The values the README's placeholders stand for, each replaced before parsing.
const PLACEHOLDERS: &[(&str, &str)] = &[("<id>", "3f2a9c"), ("<pid>", "4242")];

/// Each command line of the `sh` blocks of `markdown` as words: continuations joined, comments
/// and what follows a pipe or a redirection dropped, single and double quotes taken off.
fn sh_commands(markdown: &str) -> Vec<Vec<String>> {
    let mut commands = Vec::new();
    let mut in_sh = false;
    let mut line = String::new();
    for text in markdown.lines() {
        if text.starts_with("```") {
            in_sh = text == "```sh";
            continue;
        }
        if !in_sh {
            continue;
        }
        line.push_str(text.trim_end_matches('\\'));
        if text.ends_with('\\') {
            continue;
        }
        let words = words(&std::mem::take(&mut line));
        if !words.is_empty() {
            commands.push(words);
        }
    }
    commands
}

/// A shell line's words up to a comment, a pipe, a redirection or a command separator.
fn words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut quote = None;
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.get_or_insert_default().push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                word.get_or_insert_default();
            }
            (None, '#') if word.is_none() => break,
            (None, '|' | '>' | '<' | ';' | '&') => break,
            (None, c) if c.is_whitespace() => words.extend(word.take()),
            (None, c) => word.get_or_insert_default().push(c),
        }
    }
    words.extend(word);
    words
}

/// The arguments of each `throttle-tracer` command (its name first), `sudo` and environment
/// assignments before it left out, placeholders replaced.
fn tracer_commands(markdown: &str) -> Vec<Vec<String>> {
    let markdown = PLACEHOLDERS
        .iter()
        .fold(markdown.to_owned(), |m, (from, to)| m.replace(from, to));
    sh_commands(&markdown)
        .into_iter()
        .filter_map(|words| {
            let start = words.iter().position(|w| w != "sudo" && !w.contains('='))?;
            (words[start] == "throttle-tracer").then(|| words[start..].to_vec())
        })
        .collect()
}

#[test]
fn every_throttle_tracer_command_in_the_readme_parses() {
    let commands = tracer_commands(README);
    assert!(
        commands.len() >= 10,
        "only {} throttle-tracer commands found in the README: is the extraction broken?",
        commands.len()
    );
    let refused: Vec<String> = commands
        .iter()
        .filter_map(|args| {
            Options::try_parse_from(args)
                .err()
                .map(|e| format!("{}\n{e}", args.join(" ")))
        })
        .collect();
    assert!(refused.is_empty(), "{}", refused.join("\n"));
}

#[test]
fn a_flag_that_does_not_exist_is_refused() {
    let readme = "```sh\nsudo throttle-tracer --duration 30s --no-such-flag   # comment\n```\n";
    let commands = tracer_commands(readme);
    assert_eq!(
        commands,
        [["throttle-tracer", "--duration", "30s", "--no-such-flag"]]
    );
    assert!(Options::try_parse_from(&commands[0]).is_err());
}

#[test]
fn the_extraction_reads_shell_as_the_shell_does() {
    let readme = "text\n```sh\nsudo throttle-tracer --json > stops.ndjson\n\
                  throttle-tracer scan \\\n  --interval 10s\n\
                  RUST_LOG=debug throttle-tracer --cgroup '/kubepods.slice/*' --container <id>\n\
                  # a comment line\ncargo xtask test\n```\n```text\nthrottle-tracer --not-sh\n```\n";
    assert_eq!(
        tracer_commands(readme),
        [
            vec!["throttle-tracer", "--json"],
            vec!["throttle-tracer", "scan", "--interval", "10s"],
            vec![
                "throttle-tracer",
                "--cgroup",
                "/kubepods.slice/*",
                "--container",
                "3f2a9c"
            ],
        ]
    );
}
