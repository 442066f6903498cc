//! Every link in README.md, docs/*.md and docs/results/*.md names a file of this repository that
//! exists (and, with a `#fragment`, a heading of that file): nothing points outside the
//! repository, so the docs cannot send a reader to a file that only one machine has.
use pulldown_cmark::{Event, Parser, Tag, TagEnd};
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask/ has a parent")
        .canonicalize()
        .expect("the repository root exists")
}

/// README.md, every docs/*.md and the results files the tasks write (docs/results/*.md).
fn documents(repo: &Path) -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = ["docs", "docs/results"]
        .into_iter()
        .flat_map(|dir| std::fs::read_dir(repo.join(dir)).expect("the docs directory exists"))
        .map(|e| e.expect("a docs entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    docs.insert(0, repo.join("README.md"));
    docs
}

fn links(markdown: &str) -> Vec<String> {
    Parser::new(markdown)
        .filter_map(|event| match event {
            Event::Start(Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. }) => {
                Some(dest_url.into_string())
            }
            _ => None,
        })
        .collect()
}

/// GitHub's anchors: the heading's text, lower-cased, spaces to `-`, other punctuation dropped.
fn anchors(markdown: &str) -> Vec<String> {
    let mut anchors = Vec::new();
    let mut heading: Option<String> = None;
    for event in Parser::new(markdown) {
        match event {
            Event::Start(Tag::Heading { .. }) => {
                heading = Some(String::new());
            }
            Event::Text(text) | Event::Code(text) => {
                if let Some(h) = heading.as_mut() {
                    h.push_str(&text);
                }
            }
            Event::End(TagEnd::Heading(_)) => {
                let text = heading.take().unwrap_or_default();
                anchors.push(
                    text.to_lowercase()
                        .chars()
                        .filter_map(|c| match c {
                            ' ' => Some('-'),
                            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                            _ => None,
                        })
                        .collect(),
                );
            }
            _ => {}
        }
    }
    anchors
}

/// What is wrong with `link` in `doc`, if anything.
fn problem(repo: &Path, doc: &Path, link: &str) -> Option<String> {
    if link.contains("://") || link.starts_with("mailto:") {
        return Some("points outside the repository".into());
    }
    let (path, fragment) = match link.split_once('#') {
        Some((path, fragment)) => (path, Some(fragment)),
        None => (link, None),
    };
    let target = if path.is_empty() {
        doc.to_path_buf()
    } else {
        match doc
            .parent()
            .expect("a document's directory")
            .join(path)
            .canonicalize()
        {
            Ok(target) => target,
            Err(_) => return Some("names no file".into()),
        }
    };
    if !target.starts_with(repo) {
        return Some("points outside the repository".into());
    }
    if let Some(fragment) = fragment {
        let text = std::fs::read_to_string(&target).unwrap_or_default();
        if !anchors(&text).iter().any(|a| a == fragment) {
            return Some(format!("{} has no heading #{fragment}", target.display()));
        }
    }
    None
}

/// The first relative path in `text`, link or not, whose `..` steps climb above the
/// repository from `doc`'s directory: the project must not lean on files beside it.
fn climbs_out<'a>(repo: &Path, doc: &Path, text: &'a str) -> Option<&'a str> {
    let depth = doc
        .parent()?
        .strip_prefix(repo)
        .map_or(0, |dir| dir.components().count());
    text.split(|c: char| c.is_whitespace() || "()[]<>`'\"".contains(c))
        .find(|word| {
            let ups = word.split('/').take_while(|part| *part == "..").count();
            ups > depth
        })
}

#[test]
fn every_doc_link_resolves_inside_the_repository() {
    let repo = repo();
    let mut problems = Vec::new();
    let mut checked = 0;
    for doc in documents(&repo) {
        let text = std::fs::read_to_string(&doc).expect("a document reads");
        if let Some(path) = climbs_out(&repo, &doc, &text) {
            problems.push(format!(
                "{}: names {path}, outside the repository",
                doc.display()
            ));
        }
        for link in links(&text) {
            checked += 1;
            if let Some(problem) = problem(&repo, &doc, &link) {
                problems.push(format!("{}: ({link}) {problem}", doc.display()));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(
        checked > 0,
        "no links found: the parser or the document list is wrong"
    );
}

#[test]
fn the_checker_refuses_what_it_must() {
    let repo = repo();
    let readme = repo.join("README.md");
    for bad in [
        "https://example.org/x",
        "../../elsewhere/notes.md",
        "docs/no-such-file.md",
        "docs/kernel.md#no-such-heading",
    ] {
        assert!(problem(&repo, &readme, bad).is_some(), "{bad} accepted");
    }
    assert_eq!(problem(&repo, &readme, "docs/kernel.md"), None);
    assert_eq!(
        anchors("## Kernel requirements\n# `serve`, and *more*!\n"),
        ["kernel-requirements", "serve-and-more"]
    );
}

#[test]
fn a_path_that_climbs_above_the_repository_is_found() {
    let repo = Path::new("/r");
    let doc = Path::new("/r/docs/kernel.md");
    assert_eq!(
        climbs_out(repo, doc, "as in (../../notes/facts.md), said"),
        Some("../../notes/facts.md")
    );
    assert_eq!(climbs_out(repo, doc, "see ../README.md"), None);
    assert_eq!(
        climbs_out(repo, Path::new("/r/README.md"), "`../x`"),
        Some("../x")
    );
}
