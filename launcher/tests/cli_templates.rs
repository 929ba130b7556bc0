//! A model's chat template and tool-call format are checked before a run:
//! SmolLM2's own template renders no tools and is refused with the reason;
//! `[model] chat_template` replaces it, and a `tool_format` that cannot read
//! the template's calls is refused too. Each refusal exits 2 before any step.
mod common;

use common::*;
use std::path::Path;

fn recipe(dir: &Path, model: &Path, extra: &str) -> String {
    let text = format!(
        "reward = \"process\"\n[model]\npath = \"{}\"\n{extra}\n[tasks]\nsize = 16\nheld_out = 100\n[rl]\nsteps = 1\ngroup_size = 2\ngroups_per_step = 1\nmax_new_tokens = 4\n",
        model.display()
    );
    let path = dir.join(format!("r{}.toml", text.len()));
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

fn up(dir: &Path, recipe: &str) -> std::process::Output {
    let run = dir.join(format!("run-{}", recipe.len()));
    launcher(&["up", "deploy/local.toml", "--recipe", recipe, "--run-dir", run.to_str().unwrap(), "--metrics-addr", "127.0.0.1:0", "--eval-limit", "2"])
}

#[test]
fn templates_that_cannot_carry_tool_calls_are_refused_before_the_run() {
    let tmp = tempfile::tempdir().unwrap();
    let smol = models_dir().join("smollm2-135m");
    let o = up(tmp.path(), &recipe(tmp.path(), &smol, ""));
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("does not render the tools it is given"), "{}", stderr(&o));
    // A relative chat_template is found next to the recipe.
    std::fs::copy(repo().join("model/templates/qwen2.5-tools.jinja"), tmp.path().join("tools.jinja")).unwrap();
    let o = up(tmp.path(), &recipe(tmp.path(), &smol, "chat_template = \"tools.jinja\"\ntool_format = \"mistral\""));
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("tool_format = \"mistral\" does not read the calls this chat template writes") && e.contains("<tool_call>"), "{e}");
    let o = up(tmp.path(), &recipe(tmp.path(), &smol, "chat_template = \"missing.jinja\""));
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("model.chat_template") && stderr(&o).contains("missing.jinja"), "{}", stderr(&o));
    let o = up(tmp.path(), &recipe(tmp.path(), &smol, "tool_format = \"xml\""));
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("tool_format"), "{}", stderr(&o));
}
