//! The README's project commands as a newcomer types them: every `cargo xtask …` command in its
//! `sh` code blocks, with or without `sudo`, parses with this xtask's own command line, so that a
//! task or flag the README names and xtask lacks fails here. `throttle-tracer …` commands are
//! the tracer's to check (tracer/src/readme.rs).
use crate::Cli;
use clap::Parser as _;
use pulldown_cmark::{CodeBlockKind, Event, Parser, Tag, TagEnd};

/// The arguments of each `cargo xtask` command in `markdown`'s `sh` blocks, `xtask` first.
fn xtask_commands(markdown: &str) -> Vec<Vec<String>> {
    let mut blocks = Vec::new();
    let mut in_sh = false;
    for event in Parser::new(markdown) {
        match event {
            Event::Start(Tag::CodeBlock(CodeBlockKind::Fenced(lang))) => in_sh = &*lang == "sh",
            Event::End(TagEnd::CodeBlock) => in_sh = false,
            Event::Text(text) if in_sh => blocks.push(text.replace("\\\n", " ")),
            _ => {}
        }
    }
    blocks
        .iter()
        .flat_map(|block| block.lines())
        .filter_map(|line| {
            // Shell comments start at a word; the README's project commands quote nothing.
            let command = line.split(" #").next().unwrap_or_default();
            let words: Vec<&str> = command
                .split_whitespace()
                .skip_while(|w| *w == "sudo")
                .collect();
            let rest = words.strip_prefix(&["cargo", "xtask"])?;
            Some(
                std::iter::once("xtask")
                    .chain(rest.iter().copied())
                    .map(str::to_owned)
                    .collect(),
            )
        })
        .collect()
}

#[test]
fn every_cargo_xtask_command_in_the_readme_parses() {
    let readme =
        std::fs::read_to_string(crate::paths::root().join("README.md")).expect("README.md reads");
    let commands = xtask_commands(&readme);
    assert!(
        commands.len() >= 5,
        "only {} cargo xtask commands found in the README: is the extraction broken?",
        commands.len()
    );
    let refused: Vec<String> = commands
        .iter()
        .filter_map(|args| {
            Cli::try_parse_from(args)
                .err()
                .map(|e| format!("cargo {}\n{e}", args.join(" ")))
        })
        .collect();
    assert!(refused.is_empty(), "{}", refused.join("\n"));
}

#[test]
fn a_task_or_flag_that_does_not_exist_is_refused() {
    let readme = "```sh\nsudo cargo xtask bench --only kernel --no-such-flag   # comment\n\
                  cargo xtask no-such-task\ncargo build --release\n```\n\
                  ```text\ncargo xtask --not-sh\n```\n";
    let commands = xtask_commands(readme);
    assert_eq!(
        commands,
        [
            vec!["xtask", "bench", "--only", "kernel", "--no-such-flag"],
            vec!["xtask", "no-such-task"],
        ]
    );
    for args in &commands {
        assert!(Cli::try_parse_from(args).is_err(), "{args:?} accepted");
    }
    assert!(Cli::try_parse_from(["xtask", "bench", "--only", "kernel"]).is_ok());
}
