//! The topology and recipe parsers on mutated files (issue 19, "Also"): every
//! mutation of the committed files parses, or is refused with an error naming
//! the file and line; none panics, and what parses plans within the bounds.
//! Deterministic (a fixed-seed generator) and bounded: a few seconds.
use rlmesh_actors::controller::plan::plan;
use rlmesh_actors::controller::recipe::Recipe;
use rlmesh_actors::controller::topology::{Topology, MAX_PROCESSES};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

mod learner_common;
use learner_common::Rng;

/// Uniform index below `n`, and a uniform pick.
trait Draw {
    fn below(&mut self, n: usize) -> usize;
    fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[self.below(xs.len())]
    }
}

impl Draw for Rng {
    fn below(&mut self, n: usize) -> usize {
        ((self.next() * n as f64) as usize).min(n.saturating_sub(1))
    }
}

/// Values that stress a field: extremes, wrong types, TOML oddities.
const VALUES: &[&str] = &[
    "0", "1", "-1", "2", "4000000000", "4294967296", "99999999999999999999", "-9223372036854775808", "9223372036854775807", "1e308",
    "-1e308", "nan", "inf", "-inf", "0.5", "1.5", "\"\"", "\"x y\"", "\"main/x\"", "true", "[]", "[0, 0]", "[0, 1, 99]", "{}",
    "\"tiny\"", "\"async\"", "\"sync\"", "\"rloo\"", "\"inventory\"", "1979-05-27", "0x10", "1_000", "65535", "65536", "100000000",
];

/// Characters a byte-level mutation inserts.
const CHARS: &[&str] = &["=", "[", "]", "{", "}", ",", "\"", "'", "\n", "#", ".", "0", "9", "-", " ", "é", "\\", "[[", "]]"];

/// One mutation of a TOML text: a value replaced, a line deleted or repeated, a character inserted or deleted.
fn mutate(text: &str, rng: &mut Rng) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let i = rng.below(lines.len());
    match rng.below(6) {
        0 | 1 => {
            // Replace the value after one of the line's `=` (inline tables have several).
            let eqs: Vec<usize> = lines[i].match_indices("= ").map(|(k, _)| k + 2).collect();
            if !eqs.is_empty() {
                let start = eqs[rng.below(eqs.len())];
                let end = lines[i][start..].find([',', '}', '#']).map_or(lines[i].len(), |e| start + e);
                let v = rng.pick(VALUES);
                lines[i].replace_range(start..end, v);
            }
        }
        2 => {
            lines.remove(i);
        }
        3 => {
            let l = lines[i].clone();
            for _ in 0..=rng.below(3) {
                lines.insert(i, l.clone());
            }
        }
        4 => {
            let at = (0..=rng.below(lines[i].len() + 1).min(lines[i].len())).rev().find(|&k| lines[i].is_char_boundary(k)).unwrap_or(0);
            let c = rng.pick(CHARS);
            lines[i].insert_str(at, c);
        }
        _ => {
            if let Some((k, _)) = lines[i].char_indices().nth(rng.below(lines[i].chars().count())) {
                lines[i].remove(k);
            }
        }
    }
    lines.join("\n") + "\n"
}

fn files(dir: &str) -> Vec<(String, String)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(dir);
    let mut out: Vec<(String, String)> = std::fs::read_dir(&root)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .map(|p| (format!("{dir}/{}", p.file_name().unwrap().to_string_lossy()), std::fs::read_to_string(&p).unwrap()))
        .collect();
    out.sort();
    assert!(!out.is_empty(), "no {dir}/*.toml");
    out
}

/// An error names the file and a line: `FILE:LINE: …`.
fn assert_located(file: &str, e: &str, text: &str) {
    let rest = e.strip_prefix(&format!("{file}:")).unwrap_or_else(|| panic!("error does not name {file}: {e}\n---\n{text}"));
    let line: usize = rest.split(':').next().and_then(|l| l.parse().ok()).unwrap_or_else(|| panic!("no line in: {e}"));
    // An error at the end of the file is on the line after its last newline.
    assert!(line >= 1 && line <= text.lines().count() + 1, "line {line} outside the file: {e}\n---\n{text}");
}

#[test]
fn mutated_topologies_parse_or_are_refused_with_file_and_line() {
    let mut rng = Rng(19);
    let (mut ok, mut refused) = (0, 0);
    for (file, text) in files("deploy") {
        for _ in 0..2500 {
            let mut t = text.clone();
            for _ in 0..=rng.below(3) {
                t = mutate(&t, &mut rng);
            }
            let outcome = catch_unwind(AssertUnwindSafe(|| Topology::parse(&file, &t).map(|topo| plan(&topo).processes.len())));
            match outcome.unwrap_or_else(|_| panic!("Topology::parse or plan panicked on:\n{t}")) {
                Ok(n) => {
                    assert!(n <= MAX_PROCESSES);
                    ok += 1;
                }
                Err(e) => {
                    assert_located(&file, &e.to_string(), &t);
                    refused += 1;
                }
            }
        }
    }
    assert!(ok > 0 && refused > 0, "{ok} parsed, {refused} refused");
}

#[test]
fn mutated_recipes_parse_or_are_refused_with_file_and_line() {
    let mut rng = Rng(8);
    let (mut ok, mut refused) = (0, 0);
    for (file, text) in files("configs") {
        for _ in 0..4000 {
            let mut t = text.clone();
            for _ in 0..=rng.below(3) {
                t = mutate(&t, &mut rng);
            }
            let outcome = catch_unwind(AssertUnwindSafe(|| Recipe::parse(&file, &t).map(|r| (r.mode(), r.scale_rewards(), r.tiny_spec().intermediate))));
            match outcome.unwrap_or_else(|_| panic!("Recipe::parse panicked on:\n{t}")) {
                Ok(_) => ok += 1,
                Err(e) => {
                    assert_located(&file, &e.to_string(), &t);
                    refused += 1;
                }
            }
        }
    }
    assert!(ok > 0 && refused > 0, "{ok} parsed, {refused} refused");
}
