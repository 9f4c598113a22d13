//! The documentation holds together: every relative link of every tracked
//! Markdown file names a file that exists, every `#anchor` a heading of the
//! file it points into (GitHub's anchor rule), and the README stays a page
//! a newcomer reads in five minutes.

use pulldown_cmark::{Event, Parser, Tag, TagEnd};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The Markdown files git tracks (what a fresh clone has).
fn markdown_files() -> Vec<PathBuf> {
    let out = std::process::Command::new("git")
        .args(["ls-files", "-z", "--", "*.md"])
        .current_dir(root())
        .output()
        .expect("git ls-files");
    assert!(out.status.success(), "git ls-files failed");
    String::from_utf8(out.stdout)
        .expect("utf-8 paths")
        .split('\0')
        .filter(|p| !p.is_empty())
        .map(|p| root().join(p))
        .filter(|p| p.exists())
        .collect()
}

/// GitHub's anchor for a heading: lower case, punctuation other than `-`
/// and `_` dropped, spaces to `-`; a repeated anchor gets `-1`, `-2`, ….
fn slug(text: &str) -> String {
    text.trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

struct Doc {
    anchors: BTreeSet<String>,
    links: Vec<String>,
}

fn parse(text: &str) -> Doc {
    let mut anchors = BTreeSet::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut links = Vec::new();
    let mut heading: Option<String> = None;
    for event in Parser::new(text) {
        match event {
            Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
            Event::Text(t) | Event::Code(t) => {
                if let Some(h) = heading.as_mut() {
                    h.push_str(&t);
                }
            }
            Event::End(TagEnd::Heading(_)) => {
                let base = slug(&heading.take().unwrap_or_default());
                let n = seen.entry(base.clone()).or_insert(0);
                anchors.insert(if *n == 0 {
                    base.clone()
                } else {
                    format!("{base}-{n}")
                });
                *n += 1;
            }
            Event::Start(Tag::Link { dest_url, .. })
            | Event::Start(Tag::Image { dest_url, .. }) => links.push(dest_url.to_string()),
            _ => {}
        }
    }
    Doc { anchors, links }
}

/// Every broken link of `file`, as `file: link (why)`.
fn broken_links(file: &Path, docs: &BTreeMap<PathBuf, Doc>) -> Vec<String> {
    let doc = &docs[file];
    let shown = file
        .strip_prefix(root())
        .unwrap_or(file)
        .display()
        .to_string();
    let mut broken = Vec::new();
    for link in &doc.links {
        if link.contains("://") || link.starts_with("mailto:") {
            continue;
        }
        let (path, anchor) = link.split_once('#').unwrap_or((link, ""));
        let target = if path.is_empty() {
            file.to_path_buf()
        } else {
            file.parent().unwrap().join(path)
        };
        let Ok(target) = target.canonicalize() else {
            broken.push(format!("{shown}: {link} (no such file)"));
            continue;
        };
        if anchor.is_empty() {
            continue;
        }
        match docs.get(&target) {
            Some(t) if t.anchors.contains(anchor) => {}
            Some(_) => broken.push(format!("{shown}: {link} (no heading with that anchor)")),
            None => broken.push(format!(
                "{shown}: {link} (an anchor into a file that is not tracked Markdown)"
            )),
        }
    }
    broken
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let files = markdown_files();
    assert!(
        files.len() > 10,
        "found only {} Markdown files",
        files.len()
    );
    let docs: BTreeMap<PathBuf, Doc> = files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(f).expect("read Markdown");
            (f.canonicalize().expect("canonical path"), parse(&text))
        })
        .collect();
    let broken: Vec<String> = docs.keys().flat_map(|f| broken_links(f, &docs)).collect();
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_checker_finds_a_broken_link_and_anchor() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.md");
    std::fs::write(
        dir.path().join("b.md"),
        "# B title\n## Part `two`: more\n## Part two more\n",
    )
    .unwrap();
    std::fs::write(
        &a,
        "# A\n[ok](b.md#part-two-more) [ok2](b.md#part-two-more-1) [self](#a) \
         [gone](c.md) [bad](b.md#nope) [web](https://example.org/x#y)\n",
    )
    .unwrap();
    let docs: BTreeMap<PathBuf, Doc> = ["a.md", "b.md"]
        .iter()
        .map(|n| {
            let p = dir.path().join(n).canonicalize().unwrap();
            let text = std::fs::read_to_string(&p).unwrap();
            (p, parse(&text))
        })
        .collect();
    let broken = broken_links(&a.canonicalize().unwrap(), &docs);
    assert_eq!(broken.len(), 2, "{broken:?}");
    assert!(broken[0].ends_with("c.md (no such file)"), "{broken:?}");
    assert!(
        broken[1].ends_with("b.md#nope (no heading with that anchor)"),
        "{broken:?}"
    );
}

#[test]
fn readme_is_short() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README");
    let lines = readme.lines().count();
    assert!(
        lines <= 250,
        "README.md has {lines} lines; reference material belongs in docs/"
    );
}
