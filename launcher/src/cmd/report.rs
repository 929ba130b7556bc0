//! `launcher report`: the summary table and PNG plots of a run directory
//! (`summary.json`, `metrics.jsonl`, `rollouts.jsonl`), or two runs side by side.
//!
//! Given more than two runs, or runs of the same recipe (seeds), it compares
//! recipes: one column per recipe with each held-out figure as mean ± sample
//! standard deviation over that recipe's runs, and `compare-*.png` curves
//! (the mean over seeds per recipe) in `--out` (default: `report/` next to the
//! first run).
//!
//! Plots go to `RUN_DIR/report/`: `rewards.png` (reward mean and components),
//! `success.png` (trajectory success, final-answer accuracy) and `tool_use.png`
//! (tool-call, unnecessary-tool and repeated-call rates), each over RL steps.
//! Their text uses the TTF file in `RLMESH_FONT`, else the first DejaVu Sans
//! (Debian's `fonts-dejavu-core`) or Arial found; without one (or with
//! `RLMESH_FONT` empty) the plots are drawn without text.
//!
//! A plotted value (or step) beyond ±[`MAX_PLOTTED`] is left out of its
//! plot, and the report says so in a `note:` line: plotters' axis computation
//! never ends on a range that overflows (metrics of ±1e308 hung it).
use crate::error::{CliError, CliResult, UsageContext};
use clap::Args;
use plotters::prelude::*;
use rlmesh_core::analysis::{hacking_counts, AnalysisRow, HackingThresholds};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Arguments of `launcher report`.
#[derive(Args)]
pub struct ReportArgs {
    /// Run directory; two are printed side by side; more (or seeds of one recipe) are compared by recipe.
    #[arg(required = true, num_args = 1..)]
    run_dirs: Vec<PathBuf>,
    /// Where the comparison's plots go (default: report/ next to the first run).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print JSON instead of the table, and draw no plot: per run its state,
    /// `summary.json`, and every plotted figure per RL step (the curves the
    /// dashboards show from the same step records).
    #[arg(long)]
    json: bool,
}

/// The held-out figures a comparison shows, as `summary.json` names them.
const COMPARED: &[(&str, &str)] = &[
    ("trajectory_success", "held-out trajectory success"),
    ("step_call_accuracy", "held-out per-step call accuracy"),
    ("summary_score", "held-out summary score"),
    ("final_answer_accuracy", "held-out final-answer accuracy"),
    ("tool_call_rate", "held-out tool-call rate"),
    ("unnecessary_tool_rate", "held-out unnecessary-tool rate"),
    ("after_warmup.trajectory_success", "after warm-up: trajectory success"),
    ("steps", "RL steps"),
    ("wall_seconds", "wall seconds"),
];

/// The comparison's curves: file, title, rates, the metric.
const COMPARED_CURVES: &[(&str, &str, bool, &str)] = &[
    ("compare-success.png", "training trajectory success (mean over seeds)", true, "trajectory_success"),
    ("compare-reward.png", "training reward (mean over seeds)", false, "reward_mean"),
    ("compare-step-accuracy.png", "training per-step call accuracy (mean over seeds)", true, "step_call_accuracy"),
];

/// The largest magnitude drawn (1e15): ranges stay far from f64 overflow, and
/// no reward, rate or step of a real run comes near it; beyond it a value is a
/// logging fault, left out of the plot with a note.
pub const MAX_PLOTTED: f64 = 1e15;

/// Font files tried, in order, when `RLMESH_FONT` is unset.
const FONT_FILES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
];

/// The plots: file name, title, whether the values are rates in [0, 1], and which metrics (a trailing `/` takes every key with that prefix).
const PLOTS: &[(&str, &str, bool, &[&str])] = &[
    ("rewards.png", "reward components", false, &["reward_mean", "reward/"]),
    ("success.png", "success rates", true, &["trajectory_success", "final_answer_accuracy"]),
    ("tool_use.png", "tool-use rates", true, &["tool_call_rate", "unnecessary_tool_rate", "repeated_call_rate"]),
];

/// What a run directory holds.
struct Run {
    dir: PathBuf,
    summary: Option<Map<String, Value>>,
    metrics: Vec<Map<String, Value>>,
    rows: Vec<AnalysisRow>,
}

/// `launcher report`.
pub fn run(a: ReportArgs) -> CliResult {
    let runs = a.run_dirs.iter().map(|d| load_run(d)).collect::<CliResult<Vec<_>>>()?;
    if a.json {
        let out: Vec<Value> = runs.iter().map(Run::to_json).collect();
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "runs": out })).expect("JSON"));
        return Ok(());
    }
    let font = register_font()?;
    let recipes = by_recipe(&runs);
    if runs.len() > 2 || recipes.len() < runs.len() {
        print!("{}", compare_table(&recipes));
        let out = a.out.clone().unwrap_or_else(|| a.run_dirs[0].parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")).join("report"));
        let written = compare_plots(&recipes, &out, font.is_some())?;
        if !written.is_empty() {
            let names: Vec<String> = written.iter().map(|p| p.display().to_string()).collect();
            println!("plots: {}", names.join(", "));
        }
        return Ok(());
    }
    print!("{}", table(&runs));
    if font.is_none() {
        eprintln!("note: plots are drawn without text: RLMESH_FONT is empty or unset and none of {} exists (set RLMESH_FONT=FILE.ttf)", FONT_FILES.join(", "));
    }
    for r in &runs {
        let (written, notes) = write_plots(r, font.is_some())?;
        for n in notes {
            println!("note: {n}");
        }
        if !written.is_empty() {
            let names: Vec<String> = written.iter().map(|p| p.display().to_string()).collect();
            println!("plots: {}", names.join(", "));
        }
    }
    Ok(())
}

fn load_run(dir: &Path) -> CliResult<Run> {
    if !dir.is_dir() {
        return Err(CliError::usage(anyhow::anyhow!("{}: not a directory", dir.display())));
    }
    let summary_path = dir.join("summary.json");
    let summary = match summary_path.exists() {
        true => {
            let text = std::fs::read_to_string(&summary_path).usage(format!("{}: cannot read", summary_path.display()))?;
            match serde_json::from_str(&text).usage(format!("{}: not valid JSON", summary_path.display()))? {
                Value::Object(m) => Some(m),
                _ => return Err(CliError::usage(anyhow::anyhow!("{}: expected a JSON object", summary_path.display()))),
            }
        }
        false => None,
    };
    let metrics_path = dir.join("metrics.jsonl");
    if summary.is_none() && !metrics_path.exists() {
        return Err(CliError::usage(anyhow::anyhow!("{}: no summary.json or metrics.jsonl, so not a run directory", dir.display())));
    }
    let metrics = read_jsonl(&metrics_path, "a JSON object of step metrics")?;
    let rows = read_jsonl(&dir.join("rollouts.jsonl"), "an error-analysis row")?;
    Ok(Run { dir: dir.to_path_buf(), summary, metrics, rows })
}

/// One `T` per non-empty line of `path` (none when it is absent); a torn last
/// line (no newline yet: the run is writing it) is skipped.
fn read_jsonl<T: DeserializeOwned>(path: &Path, what: &str) -> CliResult<Vec<T>> {
    if !path.exists() {
        return Ok(vec![]);
    }
    let text = std::fs::read_to_string(path).usage(format!("{}: cannot read", path.display()))?;
    let lines: Vec<&str> = text.split('\n').collect();
    let mut out = vec![];
    for (i, line) in lines.iter().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        match serde_json::from_str(line) {
            Ok(v) => out.push(v),
            Err(_) if i + 1 == lines.len() => {}
            Err(e) => return Err(CliError::usage(anyhow::anyhow!("{}:{}: expected {what}: {e}", path.display(), i + 1))),
        }
    }
    Ok(out)
}

/// Whether a figure is a rate in [0, 1] (printed as a percentage).
fn is_rate(key: &str) -> bool {
    key.ends_with("_rate") || key.ends_with("_success") || key.ends_with("_accuracy") || key == "clip_fraction"
}

fn fmt_value(key: &str, v: &Value) -> String {
    match v {
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or(f64::NAN);
            if is_rate(key) && (0.0..=1.0).contains(&x) {
                format!("{:.2}%", 100.0 * x)
            } else if n.is_i64() || n.is_u64() {
                n.to_string()
            } else if x.abs() >= MAX_PLOTTED {
                format!("{x:e}")
            } else if x.abs() >= 100.0 {
                format!("{x:.1}")
            } else {
                format!("{x:.4}")
            }
        }
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

impl Run {
    /// `(step, value)` of every step that has a numeric `key`.
    fn series(&self, key: &str) -> Vec<(f64, f64)> {
        self.metrics
            .iter()
            .enumerate()
            .filter_map(|(i, m)| Some((m.get("step").and_then(Value::as_f64).unwrap_or(i as f64 + 1.0), m.get(key)?.as_f64()?)))
            .collect()
    }

    /// "first → last" of a metric over the steps that have it.
    fn first_last(&self, key: &str) -> Option<String> {
        let mut with = self.metrics.iter().filter_map(|m| m.get(key).filter(|v| v.is_number()));
        let first = with.next()?;
        Some(match with.next_back() {
            Some(last) => format!("{} → {}", fmt_value(key, first), fmt_value(key, last)),
            None => fmt_value(key, first),
        })
    }

    /// `--json`: the state, `summary.json`, and each plotted figure as `[[step, value], …]`.
    fn to_json(&self) -> Value {
        let mut curves = Map::new();
        for (_, _, _, keys) in PLOTS {
            for k in union_keys(self.metrics.iter(), |k, v| v.is_number() && keys.iter().any(|p| if p.ends_with('/') { k.starts_with(p) } else { k == *p })) {
                let points: Vec<Value> = self.series(&k).into_iter().map(|(s, v)| serde_json::json!([s, v])).collect();
                curves.insert(k, Value::Array(points));
            }
        }
        serde_json::json!({
            "dir": self.dir.display().to_string(),
            "state": self.state(),
            "steps_logged": self.metrics.len(),
            "summary": self.summary.clone().map_or(Value::Null, Value::Object),
            "curves": curves,
        })
    }

    fn state(&self) -> String {
        match (&self.summary, self.metrics.last()) {
            (Some(_), _) => "finished".into(),
            (None, Some(m)) => format!("running (no summary.json yet; {} steps logged)", m.get("step").map_or_else(|| self.metrics.len().to_string(), Value::to_string)),
            (None, None) => "running (no summary.json yet; no step logged)".into(),
        }
    }
}

/// Keys present in any of `maps`, in order of first appearance.
/// `{"a": {"b": 1}}` → `{"a.b": 1}`.
fn flatten(prefix: &str, map: &Map<String, Value>) -> Map<String, Value> {
    let mut out = Map::new();
    for (k, v) in map {
        let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
        match v {
            Value::Object(inner) => out.extend(flatten(&key, inner)),
            other => {
                out.insert(key, other.clone());
            }
        }
    }
    out
}

fn union_keys<'a>(maps: impl Iterator<Item = &'a Map<String, Value>>, keep: impl Fn(&str, &Value) -> bool) -> Vec<String> {
    let mut keys: Vec<String> = vec![];
    for m in maps {
        for (k, v) in m {
            if keep(k, v) && !keys.contains(k) {
                keys.push(k.clone());
            }
        }
    }
    keys
}

/// The table: one column per run; held-out figures, then first → last step metrics, then the error-analysis table's counts.
fn table(runs: &[Run]) -> String {
    let dash = || "—".to_string();
    let mut rows: Vec<(String, Vec<String>)> = vec![("run".into(), runs.iter().map(|r| r.dir.display().to_string()).collect())];
    rows.push(("state".into(), runs.iter().map(Run::state).collect()));
    rows.push(("held-out (summary.json)".into(), vec![String::new(); runs.len()]));
    // Nested figures (after_warmup, sampled.final, groups …) get one row each.
    let flat: Vec<Option<Map<String, Value>>> = runs.iter().map(|r| r.summary.as_ref().map(|s| flatten("", s))).collect();
    for key in union_keys(flat.iter().flatten(), |_, _| true) {
        let cells = flat.iter().map(|s| s.as_ref().and_then(|s| s.get(&key)).map_or_else(dash, |v| fmt_value(&key, v))).collect();
        rows.push((format!("  {key}"), cells));
    }
    rows.push(("training (first → last step)".into(), vec![String::new(); runs.len()]));
    let metric_keys = union_keys(runs.iter().flat_map(|r| &r.metrics), |_, v| v.is_number());
    for key in &metric_keys {
        rows.push((format!("  {key}"), runs.iter().map(|r| r.first_last(key).unwrap_or_else(dash)).collect()));
    }
    rows.push(("rollouts.jsonl".into(), vec![String::new(); runs.len()]));
    rows.push(("  rows".into(), runs.iter().map(|r| r.rows.len().to_string()).collect()));
    let counts: Vec<Value> = runs.iter().map(|r| serde_json::to_value(hacking_counts(&r.rows, &HackingThresholds::default())).expect("counts serialise")).collect();
    if let Some(Value::Object(first)) = counts.first() {
        for key in first.keys() {
            rows.push((format!("  {key}"), counts.iter().map(|c| c[key].to_string()).collect()));
        }
    }
    columns(&rows)
}

/// Rows of a label and one cell per column, the columns aligned.
fn columns(rows: &[(String, Vec<String>)]) -> String {
    let label_w = rows.iter().map(|(l, _)| l.chars().count()).max().unwrap_or(0);
    let n = rows.first().map_or(0, |(_, c)| c.len());
    let widths: Vec<usize> = (0..n).map(|c| rows.iter().map(|(_, cells)| cells[c].chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for (label, cells) in rows {
        let mut line = format!("{label:<label_w$}");
        for (cell, w) in cells.iter().zip(&widths) {
            let _ = write!(line, "  {cell:<w$}");
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
    out
}

/// The runs grouped by recipe (`summary.json`'s `recipe`, else the directory's name), in order of first appearance.
fn by_recipe(runs: &[Run]) -> Vec<(String, Vec<&Run>)> {
    let mut out: Vec<(String, Vec<&Run>)> = vec![];
    for r in runs {
        let name = r
            .summary
            .as_ref()
            .and_then(|s| s.get("recipe"))
            .and_then(Value::as_str)
            .map(String::from)
            .unwrap_or_else(|| r.dir.file_name().map_or_else(|| r.dir.display().to_string(), |n| n.to_string_lossy().into_owned()));
        match out.iter_mut().find(|(n, _)| *n == name) {
            Some((_, v)) => v.push(r),
            None => out.push((name, vec![r])),
        }
    }
    out
}

/// `mean ± sample std` of `xs` (`mean` alone for one value), as a rate when `key` is one.
fn mean_spread(key: &str, xs: &[f64]) -> String {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let std = (xs.len() > 1).then(|| (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt());
    let (scale, unit) = if is_rate(key) { (100.0, "%") } else { (1.0, "") };
    let digits = if is_rate(key) || mean.abs() >= 100.0 { 1 } else { 3 };
    match std {
        Some(s) => format!("{:.digits$}{unit} ± {:.digits$}", mean * scale, s * scale),
        None => format!("{:.digits$}{unit}", mean * scale),
    }
}

/// One column per recipe: each compared figure as mean ± spread over its finished runs.
fn compare_table(recipes: &[(String, Vec<&Run>)]) -> String {
    let mut rows: Vec<(String, Vec<String>)> = vec![("recipe".into(), recipes.iter().map(|(n, _)| n.clone()).collect())];
    rows.push(("runs (finished)".into(), recipes.iter().map(|(_, rs)| format!("{} ({})", rs.len(), rs.iter().filter(|r| r.summary.is_some()).count())).collect()));
    for (key, label) in COMPARED {
        let cells = recipes
            .iter()
            .map(|(_, rs)| {
                let xs: Vec<f64> = rs.iter().filter_map(|r| r.summary.as_ref()).filter_map(|s| flatten("", s).get(*key).and_then(Value::as_f64)).collect();
                if xs.is_empty() {
                    "—".to_string()
                } else {
                    mean_spread(key, &xs)
                }
            })
            .collect();
        rows.push(((*label).to_string(), cells));
    }
    // The RL loop's own time, warm-up excluded (a shared warm-up is paid by one run of each seed):
    // `seconds` of the last step row minus the first's.
    let rl = recipes
        .iter()
        .map(|(_, rs)| {
            let xs: Vec<f64> = rs.iter().filter_map(|r| Some(r.series("seconds").last()?.1 - r.series("seconds").first()?.1)).collect();
            if xs.is_empty() {
                "—".to_string()
            } else {
                mean_spread("seconds", &xs)
            }
        })
        .collect();
    rows.push(("RL seconds (first → last step)".into(), rl));
    let mut out = columns(&rows);
    let _ = writeln!(out, "(mean ± sample standard deviation over each recipe's finished runs)");
    out
}

/// The comparison's curves in `out`: per recipe, a metric's mean over its runs at each step all of them logged.
fn compare_plots(recipes: &[(String, Vec<&Run>)], out: &Path, text: bool) -> CliResult<Vec<PathBuf>> {
    let mut written = vec![];
    let drawable = |x: f64| x.is_finite() && x.abs() <= MAX_PLOTTED;
    for (file, title, rates, key) in COMPARED_CURVES {
        let mut series: Vec<(String, Vec<(f64, f64)>)> = vec![];
        for (name, rs) in recipes {
            let each: Vec<Vec<(f64, f64)>> = rs.iter().map(|r| r.series(key)).filter(|s| !s.is_empty()).collect();
            let Some(shortest) = each.iter().map(Vec::len).min() else { continue };
            let mean: Vec<(f64, f64)> = (0..shortest)
                .map(|i| (each[0][i].0, each.iter().map(|s| s[i].1).sum::<f64>() / each.len() as f64))
                .filter(|&(x, y)| drawable(x) && drawable(y))
                .collect();
            if !mean.is_empty() {
                series.push((format!("{name} (n={})", each.len()), mean));
            }
        }
        if series.is_empty() {
            continue;
        }
        std::fs::create_dir_all(out).map_err(|e| anyhow::anyhow!("{}: cannot create: {e}", out.display()))?;
        let path = out.join(file);
        line_plot(&path, title, &series, *rates, text).map_err(|e| anyhow::anyhow!("{}: drawing: {e}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

/// Registers the plots' font; `None` when there is none to use.
fn register_font() -> CliResult<Option<PathBuf>> {
    let path = match std::env::var_os("RLMESH_FONT") {
        Some(p) if p.is_empty() => return Ok(None),
        Some(p) => PathBuf::from(p),
        None => match FONT_FILES.iter().map(PathBuf::from).find(|p| p.exists()) {
            Some(p) => p,
            None => return Ok(None),
        },
    };
    let bytes = std::fs::read(&path).usage(format!("RLMESH_FONT {}: cannot read", path.display()))?;
    plotters::style::register_font("sans-serif", FontStyle::Normal, Box::leak(bytes.into_boxed_slice()))
        .map_err(|_| CliError::usage(anyhow::anyhow!("{}: not a TrueType font", path.display())))?;
    Ok(Some(path))
}

/// Draws every plot that has data into `RUN_DIR/report/`; returns the files
/// written and a note for each metric that had points left out (beyond ±[`MAX_PLOTTED`]).
fn write_plots(run: &Run, text: bool) -> CliResult<(Vec<PathBuf>, Vec<String>)> {
    let dir = run.dir.join("report");
    let mut written = vec![];
    let mut notes = vec![];
    let drawable = |x: f64| x.is_finite() && x.abs() <= MAX_PLOTTED;
    for (file, title, rates, keys) in PLOTS {
        let names = union_keys(run.metrics.iter(), |k, v| v.is_number() && keys.iter().any(|p| if p.ends_with('/') { k.starts_with(p) } else { k == *p }));
        let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
        for k in names {
            let all = run.series(&k);
            let kept: Vec<(f64, f64)> = all.iter().copied().filter(|&(x, y)| drawable(x) && drawable(y)).collect();
            if kept.len() < all.len() {
                notes.push(format!(
                    "{}: {} of {} points of {k} left out of {file}: the step or value is beyond ±{MAX_PLOTTED:e}",
                    run.dir.display(),
                    all.len() - kept.len(),
                    all.len()
                ));
            }
            if !kept.is_empty() {
                series.push((k, kept));
            }
        }
        if series.is_empty() {
            continue;
        }
        std::fs::create_dir_all(&dir).map_err(|e| anyhow::anyhow!("{}: cannot create: {e}", dir.display()))?;
        let path = dir.join(file);
        line_plot(&path, &format!("{title} — {}", run.dir.display()), &series, *rates, text).map_err(|e| anyhow::anyhow!("{}: drawing: {e}", path.display()))?;
        written.push(path);
    }
    Ok((written, notes))
}

/// One PNG of lines over steps; `rates` fixes the y axis to [0, 1]; `text` draws title, labels and legend.
fn line_plot(path: &Path, title: &str, series: &[(String, Vec<(f64, f64)>)], rates: bool, text: bool) -> Result<(), Box<dyn std::error::Error>> {
    let points = || series.iter().flat_map(|(_, s)| s.iter().copied());
    let span = |lo: f64, hi: f64| if hi > lo { (lo, hi) } else { (lo - 0.5, hi + 0.5) };
    let (x0, x1) = span(points().map(|p| p.0).fold(f64::INFINITY, f64::min), points().map(|p| p.0).fold(f64::NEG_INFINITY, f64::max));
    let (y0, y1) = if rates {
        (0.0, 1.0)
    } else {
        let (lo, hi) = span(points().map(|p| p.1).fold(f64::INFINITY, f64::min), points().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max));
        let pad = 0.05 * (hi - lo);
        (lo - pad, hi + pad)
    };
    let root = BitMapBackend::new(path, (960, 540)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut builder = ChartBuilder::on(&root);
    builder.margin(20);
    if text {
        builder.caption(title, ("sans-serif", 22)).x_label_area_size(40).y_label_area_size(60);
    }
    let mut chart = builder.build_cartesian_2d(x0..x1, y0..y1)?;
    let mut mesh = chart.configure_mesh();
    if text {
        mesh.x_desc("step").x_label_formatter(&|x| format!("{x:.0}"));
    } else {
        mesh.x_labels(0).y_labels(0);
    }
    mesh.draw()?;
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let drawn = chart.draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))?;
        if text {
            drawn.label(name.as_str()).legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        }
    }
    if text {
        // The legend goes to the corner the lines leave free at the end.
        let last_mean = series.iter().filter_map(|(_, s)| s.last()).map(|p| p.1).sum::<f64>() / series.len() as f64;
        let corner = if last_mean > (y0 + y1) / 2.0 { SeriesLabelPosition::LowerRight } else { SeriesLabelPosition::UpperRight };
        chart.configure_series_labels().background_style(WHITE.mix(0.85)).border_style(BLACK).position(corner).draw()?;
    }
    root.present()?;
    Ok(())
}
