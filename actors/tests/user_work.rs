//! A user's own work in the actors: recipes naming files, tool servers and
//! verifiers; rewards combined over functions, with unscorable rollouts kept
//! out of group statistics; warm-up conversations trained on assistant
//! tokens only.
use rlmesh_actors::controller::recipe::{Recipe, RewardKind};
use rlmesh_actors::reward::{JudgeSpec, RewardSpec, Scorer};
use rlmesh_actors::warmup::training_tokens;
use rlmesh_core::dataset::conversation::parse_sft_jsonl;
use rlmesh_core::{Group, Trajectory};
use serde_json::json;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn recipe_with(extra: &str) -> Result<Recipe, String> {
    let text = format!("reward = \"process\"\ntools = []\n[tasks]\nfile = \"train.jsonl\"\nheld_out = 5\n{extra}");
    Recipe::parse("examples/tool-agent/recipe.toml", &text).map_err(|e| e.to_string())
}

#[test]
fn the_example_recipe_names_its_files_and_functions() {
    let r = Recipe::load(&root().join("examples/tool-agent/recipe.toml")).unwrap();
    let dir = root().join("examples/tool-agent").canonicalize().unwrap();
    assert_eq!(r.tasks.file.as_deref(), Some(dir.join("train.jsonl").to_str().unwrap()));
    assert_eq!(r.sft.file.as_deref(), Some(dir.join("sft.jsonl").to_str().unwrap()));
    assert_eq!(r.tool_servers[0].cwd.as_deref(), Some(dir.as_path()), "a server's command runs beside the recipe");
    assert_eq!(r.reward_functions[0].cwd.as_deref(), Some(dir.to_str().unwrap()));
    assert!(!r.model.path.contains("${"), "{}", r.model.path);
    let (train, held_out) = r.tasks().unwrap();
    assert_eq!((train.len(), held_out.len()), (350, 50));
    assert!(train.iter().chain(&held_out).all(|t| t.id.starts_with("shop-")), "every task id comes from the file");
    let ids: std::collections::HashSet<&str> = train.iter().map(|t| t.id.as_str()).collect();
    assert!(held_out.iter().all(|t| !ids.contains(t.id.as_str())));
    let names: Vec<String> =
        rlmesh_actors::controller::recipe::rewards::reward_functions(r.reward, &r.reward_weights, &rlmesh_actors::controller::recipe::rewards::env_sources(&r.tool_servers), &r.reward_functions)
            .into_iter()
            .map(|f| format!("{}={}", f.name, f.weight))
            .collect();
    assert_eq!(names, ["process=1", "verifier:catalogue=0.5"]);
}

#[test]
fn recipe_errors_name_the_field() {
    let cases = [
        ("[reward_weights]\nfinal_corect = 0.5\n", "reward_weights.final_corect", "unknown reward function or component"),
        ("[reward_weights]\n\"verifier:x\" = 0.5\n", "reward_weights.verifier:x", "its [[reward_function]] weight"),
        ("[[reward_function]]\nname = \"v\"\ncommand = [\"a\"]\nurl = \"http://x\"\n", "reward_function[0].command", "give one of"),
        ("[[reward_function]]\nname = \"v\"\nurl = \"ftp://x\"\n", "reward_function[0].url", "http://"),
        ("[[tool_server]]\nname = \"s\"\n", "tool_server[0].command", "give one of them"),
        ("[[tool_server]]\nname = \"s\"\ncommand = [\"x\"]\n[[tool_server]]\nname = \"s\"\nurl = \"http://x/mcp\"\n", "tool_server[1].name", "already the name"),
        ("[tool_limits]\ntimeout_s = 0\n", "tool_limits.timeout_s", "must be > 0"),
        ("[sft]\nsteps = 3\n", "sft.file", "the expert warm-up writes conversations for generated tasks only"),
    ];
    for (extra, field, why) in cases {
        let e = recipe_with(extra).unwrap_err();
        assert!(e.contains(&format!("field \"{field}\"")) && e.contains(why), "{extra:?}: {e}");
    }
    let e = Recipe::parse("r.toml", "reward = \"process\"\n[tasks]\nheld_out = 200\n").unwrap_err().to_string();
    assert!(e.contains("field \"tasks.size\"") && e.contains("name a file"), "{e}");
    let e = recipe_with("held_out_file = \"h.jsonl\"\n").unwrap_err();
    assert!(e.contains("field \"tasks.held_out\""), "{e}");
    // `[reward_weights]` knows the servers' reward functions and the rubric's components.
    let ok = "[[tool_server]]\nname = \"files\"\ncommand = [\"python3\", \"t.py\"]\nreward_tool = \"get_reward\"\n[reward_weights]\n\"env:files\" = 2.0\nprocess = 0.5\nrepeated_call = -1.0\n";
    recipe_with(ok).unwrap();
}

fn trajectory(answer: &str) -> Trajectory {
    serde_json::from_value(json!({
        "task_id": "t", "sample_index": 0, "prompt_len": 1, "rendered_prompt": "", "token_ids": [1, 2], "loss_mask": [0, 1],
        "logprobs": [0.0, 0.0], "versions": [0, 0], "segments": [], "summary": null, "steps": [], "format_errors": [],
        "messages": [{"role": "assistant", "content": answer}], "completion": answer, "final_answer": answer, "stop_reason": "answered"
    }))
    .unwrap()
}

fn group() -> Group {
    let task = serde_json::from_value(json!({"id": "t", "prompt": "Say 7.", "requires_tool": false, "expected_answer": "7", "allowed_tools": []})).unwrap();
    Group { group_id: 1, task, trajectories: vec![trajectory("7"), trajectory("8")], failed: None, earlier_segments: vec![] }
}

fn scorer(kind: &str, weight: f64, timeout_s: f64) -> Scorer {
    let script = root().join("actors/tests/user_work/verifiers.py");
    let v = format!("name = \"{kind}\"\ncommand = [\"python3\", \"{}\", \"{kind}\"]\nweight = {weight}\ntimeout_s = {timeout_s}\nmax_restarts = 1\n", script.display());
    let spec = RewardSpec { verifiers: vec![toml::from_str(&v).unwrap()], ..RewardSpec::rubric(RewardKind::Process, JudgeSpec::Rule) };
    Scorer::new(&spec).unwrap()
}

#[test]
fn a_verifier_adds_its_weighted_score_to_the_rubric() {
    let rubric = Scorer::new(&RewardSpec::rubric(RewardKind::Process, JudgeSpec::Rule)).unwrap().score(group());
    let with = scorer("good", 0.5, 30.0).score(group());
    assert_eq!(with.unscorable, None);
    // The right answer: the rubric's total plus 0.5 × 1; the wrong one: the rubric's plus 0.
    assert_eq!(with.scores[0].total, rubric.scores[0].total + 0.5);
    assert_eq!(with.scores[1].total, rubric.scores[1].total);
    assert!(rubric.scores[0].total > rubric.scores[1].total);
    assert_eq!(with.scores[0].functions, [("process".to_string(), Some(rubric.scores[0].total)), ("verifier:good".to_string(), Some(1.0))]);
}

#[test]
fn verifiers_that_fail_make_the_group_unscorable_never_zero() {
    for (kind, timeout_s, why) in [("crash", 30.0, ""), ("sleep", 1.0, "no answer within 1s"), ("garbage", 30.0, "")] {
        let g = scorer(kind, 1.0, timeout_s).score(group());
        let reason = g.unscorable.clone().unwrap_or_else(|| panic!("{kind}: a failed verifier must make the group unscorable"));
        assert!(reason.contains(&format!("verifier:{kind}")) && reason.contains(why), "{kind}: {reason}");
        assert!(g.scores.iter().all(|s| s.total.is_nan()), "{kind}: no rollout gets a number: {:?}", g.scores.iter().map(|s| s.total).collect::<Vec<_>>());
    }
}

#[test]
fn a_warm_up_conversation_trains_on_the_assistant_turns_only() {
    let dir = tempfile::tempdir().unwrap();
    let model = root().join("model/templates/qwen2.5-tools.jinja");
    let smollm2 = {
        let out = std::process::Command::new(root().join("scripts/prepare-models.sh")).output().unwrap();
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim().lines().last().unwrap()).join("smollm2-135m")
    };
    let with_tools = rlmesh_actors::controller::init::with_chat_template(&smollm2, &model, &dir.path().join("m")).unwrap();
    let tok = rlmesh_model::Tokenizer::load(&with_tools).unwrap();
    let line = std::fs::read_to_string(root().join("examples/tool-agent/sft.jsonl")).unwrap();
    let conv = parse_sft_jsonl(&line, "sft.jsonl").unwrap();
    let c = conv.iter().find(|c| c.messages.iter().any(|m| m.tool_calls.is_some())).unwrap();
    let tools = vec![json!({"type": "function", "function": {"name": "price", "description": "d", "parameters": {"type": "object", "properties": {"item": {"type": "string"}}}}})];
    let (ids, mask) = training_tokens(&tok, &c.messages, Some(&tools)).unwrap();
    // The whole sequence is the template's rendering of the conversation (up to the last end token).
    let values: Vec<serde_json::Value> = c.messages.iter().map(|m| serde_json::to_value(m).unwrap()).collect();
    let full = tok.render(&values, Some(&tools), false).unwrap();
    let text = tok.decode(&ids, false).unwrap();
    assert!(full.starts_with(&text) && full[text.len()..].trim().is_empty(), "{text:?}\n{full:?}");
    // The trained runs are exactly the assistant messages, each with its end token.
    let mut runs = Vec::new();
    let mut i = 0;
    while i < ids.len() {
        let j = (i..ids.len()).find(|&j| mask[j] != mask[i]).unwrap_or(ids.len());
        if mask[i] == 1 {
            runs.push(tok.decode(&ids[i..j], false).unwrap());
        }
        i = j;
    }
    let assistants = c.messages.iter().filter(|m| m.role == "assistant").count();
    assert_eq!(runs.len(), assistants, "{runs:?}");
    assert!(runs.iter().all(|r| r.ends_with("<|im_end|>")), "{runs:?}");
    assert!(runs[0].contains("<tool_call>") && runs[1].contains(&c.messages.last().unwrap().content), "{runs:?}");
    assert!(!runs.iter().any(|r| r.contains("<|im_start|>user") || r.contains("<tool_response>")), "{runs:?}");
}
