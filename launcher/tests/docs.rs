//! The README and docs/ against the project's records and each other: the
//! README stays within its line budget (it is for users; histories go to
//! docs/), every relative link reaches a file and heading, and no page says
//! that something has not run on a GPU when `docs/gpu-check.md`'s record says
//! it passed there.
mod common;

use common::repo;
use std::path::{Path, PathBuf};

/// README.md and every page of docs/.
fn pages() -> Vec<PathBuf> {
    let mut v = vec![repo().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo().join("docs")).unwrap().flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|e| e == "md")).collect();
    docs.sort();
    v.extend(docs);
    v
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// A page's text without its fenced code blocks.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The sentences of a page's prose: paragraphs, list items and table rows
/// are joined to one line each, then cut after `.`, `!` or `?` where the next
/// word starts a sentence.
fn sentences(text: &str) -> Vec<String> {
    let mut blocks: Vec<String> = vec![];
    let mut cur = String::new();
    for line in prose(text).lines() {
        let t = line.trim();
        let starts_block = t.is_empty() || t.starts_with("- ") || t.starts_with("* ") || t.starts_with('|') || t.starts_with('#') || t.split_once(". ").is_some_and(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
        if starts_block && !cur.is_empty() {
            blocks.push(std::mem::take(&mut cur));
        }
        if !t.is_empty() {
            cur.push_str(t);
            cur.push(' ');
        }
    }
    blocks.push(cur);
    let mut out = vec![];
    for b in blocks {
        let chars: Vec<char> = b.chars().collect();
        let mut start = 0;
        for i in 0..chars.len() {
            let end = matches!(chars[i], '.' | '!' | '?') && chars.get(i + 1) == Some(&' ') && chars.get(i + 2).is_some_and(|c| c.is_uppercase() || matches!(c, '*' | '`' | '(' | '['));
            if end {
                out.push(chars[start..=i].iter().collect::<String>().trim().to_string());
                start = i + 2;
            }
        }
        let rest: String = chars[start.min(chars.len())..].iter().collect();
        if !rest.trim().is_empty() {
            out.push(rest.trim().to_string());
        }
    }
    out
}

/// One row of gpu-check.md's record: the words the docs use for it, and whether it passed on a GPU.
#[derive(Debug)]
struct Item {
    what: String,
    terms: Vec<String>,
    passed: bool,
}

/// The table under "## Record: what has run on a GPU" in docs/gpu-check.md.
fn gpu_record(text: &str) -> Vec<Item> {
    let at = text.find("## Record: what has run on a GPU").expect("docs/gpu-check.md has no \"## Record: what has run on a GPU\" section");
    let rows = text[at..].lines().skip(1).skip_while(|l| !l.starts_with('|')).take_while(|l| l.starts_with('|')).skip(2);
    rows.map(|row| {
        let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
        assert_eq!(cells.len(), 3, "a record row has three cells (what, named in the docs as, on a GPU): {row}");
        let terms = cells[1].split(", ").map(|t| t.trim_matches('`').to_lowercase()).filter(|t| !t.is_empty()).collect();
        let passed = cells[2].starts_with("passed");
        assert!(passed || cells[2] == "not run", "a record row's result is \"passed, …\" or \"not run\": {row}");
        Item { what: cells[0].to_string(), terms, passed }
    })
    .collect()
}

/// Words by which a sentence says that something has not run.
const DENIALS: [&str; 8] = ["not yet", "never ran", "never run", "has not run", "have not run", "hasn't run", "not run on", "none of this has run"];

/// The sentences of `text` that say something has not run on a GPU without
/// naming an item the record has as not run; each with the passed items it names.
fn unsupported_denials(text: &str, record: &[Item]) -> Vec<(String, Vec<String>)> {
    let names = |s: &str, passed: bool| -> Vec<String> { record.iter().filter(|i| i.passed == passed && i.terms.iter().any(|t| s.contains(t.as_str()))).map(|i| i.what.clone()).collect() };
    sentences(text)
        .into_iter()
        .filter_map(|s| {
            let l = s.to_lowercase();
            let denies = l.contains("gpu") && DENIALS.iter().any(|d| l.contains(d));
            (denies && names(&l, false).is_empty()).then(|| (s, names(&l, true)))
        })
        .collect()
}

#[test]
fn no_page_says_something_has_not_run_on_a_gpu_unless_the_gpu_record_says_so() {
    let record = gpu_record(&read(&repo().join("docs/gpu-check.md")));
    assert!(record.iter().any(|i| i.passed) && record.iter().any(|i| !i.passed), "the record holds passed and not-run rows: {record:?}");
    let mut bad = vec![];
    for page in pages() {
        for (sentence, passed) in unsupported_denials(&read(&page), &record) {
            let names = if passed.is_empty() { "names no \"not run\" item of the record".to_string() } else { format!("names what passed on a GPU: {}", passed.join("; ")) };
            bad.push(format!("{}: {names}:\n    {sentence}", page.strip_prefix(repo()).unwrap_or(&page).display()));
        }
    }
    assert!(bad.is_empty(), "sentences that say something has not run on a GPU, against docs/gpu-check.md's record:\n{}", bad.join("\n"));
}

#[test]
fn the_gpu_record_check_catches_a_denial_of_what_passed_and_lets_true_ones_be() {
    let record = gpu_record(
        "## Record: what has run on a GPU\n\n| what | named in the docs as | on a GPU |\n|---|---|---|\n\
         | `dev-1gpu`: the pipeline | `dev-1gpu`, pipeline | passed, H200, 2026-12-04 |\n\
         | two GPUs | `dev-2gpu`, two GPUs | not run |\n",
    );
    // What docs/architecture.md said before the record was read.
    let old = "- GPU placements: a rollout and a learner\n  process share a GPU. None of this has run on a GPU yet: the one\n  device session so far ran the digest checks, and the loan ended before the\n  pipeline sections.\n";
    let found = unsupported_denials(old, &record);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].0.starts_with("None of this has run") && found[0].1 == ["`dev-1gpu`: the pipeline"], "{found:?}");
    // The checksum kernel's sentence in docs/performance.md: no "not run" item named.
    let digest = "- **On GPUs the digest is computed on the device** (built 2026-12-02, not yet\n  run on one): it keys each word.\n";
    assert_eq!(unsupported_denials(digest, &record).len(), 1);
    let true_one = "The pipeline ran on one GPU. Learner ranks on two GPUs (`deploy/dev-2gpu.toml`) have not run yet.\n\n```\nnot yet run on a GPU\n```\n";
    assert!(unsupported_denials(true_one, &record).is_empty());
}

/// The most lines README.md may have: it holds what rlmesh is, the set-up,
/// how to run it, the commands, the metrics and the current figures; the
/// histories behind the figures live in docs/.
const README_LINES: usize = 275;

#[test]
fn the_readme_stays_within_its_line_budget() {
    let n = read(&repo().join("README.md")).lines().count();
    assert!(n <= README_LINES, "README.md has {n} lines, over its budget of {README_LINES}: move histories and details to docs/ and link them");
}

/// GitHub's anchor for a heading: lowercase, every character but letters,
/// digits, `-`, `_` and spaces dropped, spaces as `-`.
fn slug(heading: &str) -> String {
    heading.trim_start_matches('#').trim().to_lowercase().chars().filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' ')).map(|c| if c == ' ' { '-' } else { c }).collect()
}

/// The anchors of a page's headings (a repeated heading's get `-1`, `-2`, … as on GitHub).
fn anchors(text: &str) -> Vec<String> {
    let mut out: Vec<String> = vec![];
    for line in prose(text).lines().filter(|l| l.starts_with('#')) {
        let base = slug(line);
        let n = out.iter().filter(|a| **a == base || a.strip_prefix(&format!("{base}-")).is_some_and(|k| k.parse::<u32>().is_ok())).count();
        out.push(if n == 0 { base } else { format!("{base}-{n}") });
    }
    out
}

/// The targets of a page's `[text](target)` links and images that name no scheme.
fn relative_links(text: &str) -> Vec<String> {
    let prose = prose(text);
    let mut out = vec![];
    let mut rest = prose.as_str();
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = rest[..end].trim();
        if !target.contains("://") && !target.starts_with("mailto:") && !target.is_empty() {
            out.push(target.to_string());
        }
        rest = &rest[end..];
    }
    out
}

#[test]
fn every_relative_link_of_the_readme_and_docs_reaches_a_file_and_its_heading() {
    let mut bad = vec![];
    let mut checked = 0;
    for page in pages() {
        for target in relative_links(&read(&page)) {
            checked += 1;
            let (path, anchor) = target.split_once('#').map_or((target.as_str(), None), |(p, a)| (p, Some(a)));
            let file = if path.is_empty() { page.clone() } else { page.parent().unwrap().join(path) };
            let shown = page.strip_prefix(repo()).unwrap_or(&page).display().to_string();
            if !file.exists() {
                bad.push(format!("{shown}: ({target}): no file {}", file.display()));
                continue;
            }
            if let Some(a) = anchor {
                let have = anchors(&read(&file));
                if !have.iter().any(|h| h == &a.to_lowercase()) {
                    bad.push(format!("{shown}: ({target}): {} has no heading with the anchor #{a} (its anchors: {})", file.display(), have.join(", ")));
                }
            }
        }
    }
    assert!(checked > 10, "only {checked} relative links found: is the link reader broken?");
    assert!(bad.is_empty(), "links that lead nowhere:\n{}", bad.join("\n"));
}

#[test]
fn anchors_and_links_are_read_as_github_makes_them() {
    assert_eq!(slug("## The main job's accuracy: what limits the last points"), "the-main-jobs-accuracy-what-limits-the-last-points");
    assert_eq!(slug("## `bench pipeline`: where `local-procs` lost (measured 2026-12-01)"), "bench-pipeline-where-local-procs-lost-measured-2026-12-01");
    assert_eq!(slug("### What ractor_cluster got wrong, and what rlmesh does about it"), "what-ractor_cluster-got-wrong-and-what-rlmesh-does-about-it");
    assert_eq!(anchors("# A\n## Notes\n```\n# not a heading\n```\n## Notes\n"), ["a", "notes", "notes-1"]);
    let text = "See [the docs](docs/a.md#b), ![plot](figures/p.png) and [a site](https://example.org).\n```\n[in code](nowhere.md)\n```\n";
    assert_eq!(relative_links(text), ["docs/a.md#b", "figures/p.png"]);
}
