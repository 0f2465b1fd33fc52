//! Checks of the documentation (tests only).
//!
//! - Generated blocks: the tables of `docs/reference.md` between `<!-- BEGIN GENERATED: NAME -->`
//!   and `<!-- END GENERATED: NAME -->` are rendered from the code by the tests that call
//!   [`check_generated`] (events in `reason`, metrics in `metrics`, flags in `cli`). A block that
//!   differs fails its test; with `UPDATE_DOCS=1` the test rewrites the block instead.
//! - Links: every relative link of the Markdown pages resolves to a file, and its `#anchor` to a
//!   heading of that file (GitHub's anchor rules).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The page holding the generated tables, relative to the crate root.
pub const REFERENCE: &str = "docs/reference.md";

/// One read-modify-write of the reference page at a time (the tests run in parallel).
static REWRITE: Mutex<()> = Mutex::new(());

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The lines between the markers of block `name` in `text`, and the byte range they take.
fn block(text: &str, name: &str) -> Option<(std::ops::Range<usize>, String)> {
    let begin = format!("<!-- BEGIN GENERATED: {name} -->\n");
    let end = format!("<!-- END GENERATED: {name} -->");
    let start = text.find(&begin)? + begin.len();
    let stop = start + text[start..].find(&end)?;
    Some((start..stop, text[start..stop].to_string()))
}

/// Compares block `name` of the reference page with `rendered` (whole lines, each ending in a
/// newline); with `UPDATE_DOCS=1` in the environment, writes `rendered` into the block instead.
pub fn check_generated(name: &str, rendered: &str) {
    let _guard = REWRITE.lock().unwrap_or_else(|p| p.into_inner());
    let path = root().join(REFERENCE);
    let text = std::fs::read_to_string(&path).expect("docs/reference.md");
    let (range, current) = block(&text, name).unwrap_or_else(|| {
        panic!("{REFERENCE} has no block `<!-- BEGIN GENERATED: {name} -->` ... `<!-- END GENERATED: {name} -->`")
    });
    if current == rendered {
        return;
    }
    if std::env::var("UPDATE_DOCS").is_ok_and(|v| v == "1") {
        let mut new = text.clone();
        new.replace_range(range, rendered);
        std::fs::write(&path, new).expect("write docs/reference.md");
        return;
    }
    panic!(
        "{REFERENCE}, block {name}, differs from the code; run `UPDATE_DOCS=1 cargo test --lib` \
         to rewrite it.\n--- in the page\n{current}--- from the code\n{rendered}"
    );
}

/// A table cell: no line breaks, `|` escaped.
pub fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// `text` without fenced code blocks and inline code spans (links there are not links).
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            out.push('\n');
            continue;
        }
        if fenced {
            out.push('\n');
            continue;
        }
        // Drop `code` spans; a backtick left alone stays.
        let mut rest = line;
        while let Some(open) = rest.find('`') {
            match rest[open + 1..].find('`') {
                Some(close) => {
                    out.push_str(&rest[..open]);
                    rest = &rest[open + 1 + close + 1..];
                }
                None => break,
            }
        }
        out.push_str(rest);
        out.push('\n');
    }
    out
}

/// The targets of the inline links `[text](target)` in `text`.
fn links(text: &str) -> Vec<String> {
    let prose = prose(text);
    let mut out = Vec::new();
    let mut rest = prose.as_str();
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        if let Some(end) = rest.find(')') {
            let target = rest[..end].split_whitespace().next().unwrap_or_default();
            out.push(target.to_string());
            rest = &rest[end..];
        }
    }
    out
}

/// GitHub's anchor of a heading: lowercase, punctuation but `-` and `_` dropped, spaces to `-`.
pub fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of every heading in `text`, with GitHub's `-1`, `-2` suffixes for repeats.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        if fenced {
            continue;
        }
        let base = anchor(heading.trim_start_matches('#'));
        let mut name = base.clone();
        let mut n = 0;
        while out.contains(&name) {
            n += 1;
            name = format!("{base}-{n}");
        }
        out.insert(name);
    }
    out
}

/// The broken relative links of `file` (whose text is `text`), as readable messages.
fn broken_links(file: &Path, text: &str) -> Vec<String> {
    let mut broken = Vec::new();
    for target in links(text) {
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (path, fragment) = match target.split_once('#') {
            Some((p, f)) => (p, Some(f)),
            None => (target.as_str(), None),
        };
        let dest = if path.is_empty() {
            file.to_path_buf()
        } else {
            file.parent().unwrap_or(Path::new(".")).join(path)
        };
        if !dest.exists() {
            broken.push(format!("{}: {target}: no such file", file.display()));
            continue;
        }
        let Some(fragment) = fragment else { continue };
        let headings = match std::fs::read_to_string(&dest) {
            Ok(t) if dest.extension().is_some_and(|e| e == "md") => anchors(&t),
            _ => {
                broken.push(format!(
                    "{}: {target}: an anchor into a non-Markdown file",
                    file.display()
                ));
                continue;
            }
        };
        if !headings.contains(fragment) {
            broken.push(format!(
                "{}: {target}: no heading with that anchor",
                file.display()
            ));
        }
    }
    broken
}

/// The Markdown pages whose links are checked: the README, docs/ (all levels) and the other
/// pages of the repository root and of bench/ and artifacts/.
fn pages() -> Vec<PathBuf> {
    let root = root();
    let mut out = Vec::new();
    let mut dirs = vec![root.join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("docs/").flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    for page in [
        "README.md",
        "BENCHMARKS.md",
        "CHANGELOG.md",
        "bench/README.md",
        "artifacts/README.md",
    ] {
        out.push(root.join(page));
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_relative_link_resolves() {
        // Not while a test rewrites docs/reference.md (UPDATE_DOCS=1).
        let _guard = REWRITE.lock().unwrap_or_else(|p| p.into_inner());
        let pages = pages();
        assert!(pages.len() > 8, "{pages:?}");
        let broken: Vec<String> = pages
            .iter()
            .flat_map(|p| {
                let text = std::fs::read_to_string(p).expect("page");
                broken_links(p, &text)
            })
            .collect();
        assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    }

    #[test]
    fn the_link_check_can_fail() {
        let file = root().join("docs/README.md");
        let text = "[a](../README.md#no-such-heading) [b](missing.md) [c](#also-missing) \
                    `[d](in-code.md)` [e](https://example.com/x.md) [f](usage.md#safety-contract)";
        let broken = broken_links(&file, text);
        assert_eq!(broken.len(), 3, "{broken:#?}");
    }

    #[test]
    fn anchors_follow_githubs_rules() {
        assert_eq!(
            anchor(" Local test cluster (e2e)"),
            "local-test-cluster-e2e"
        );
        assert_eq!(anchor("`kubectl scaledown`"), "kubectl-scaledown");
        assert_eq!(
            anchor("Pod simulation contract (KWOK stages)"),
            "pod-simulation-contract-kwok-stages"
        );
        assert_eq!(anchor("Flags, Events & metrics"), "flags-events--metrics");
        let text = "# A\n## B\n```\n# not a heading\n```\n## B\n";
        let all = anchors(text);
        assert_eq!(all, ["a", "b", "b-1"].map(String::from).into());
    }

    #[test]
    fn generated_blocks_are_found() {
        let text = "x\n<!-- BEGIN GENERATED: t -->\n| a |\n<!-- END GENERATED: t -->\ny\n";
        assert_eq!(block(text, "t").map(|b| b.1), Some("| a |\n".into()));
        assert_eq!(block(text, "u"), None);
    }
}
