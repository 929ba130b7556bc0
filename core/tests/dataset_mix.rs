//! The generated task mix: deterministic, in the configured proportions,
//! distinct, gradable, and its gold calls really produce the expected answers.
use rlmesh_core::dataset::{generate, split_holdout, validate_task, MixConfig};
use rlmesh_core::tools::{ExecLimits, ToolRegistry};
use rlmesh_core::{Task, TaskType};
use std::collections::HashSet;

fn mix(size: usize, seed: u64) -> Vec<Task> {
    generate(&MixConfig { size, tool_fraction: 0.4, multi_step_fraction: 0.5, inventory: true, three_step_fraction: 0.5, seed, drill_words: false }).unwrap()
}

#[test]
fn generation_is_deterministic_for_a_seed() {
    assert_eq!(mix(300, 7), mix(300, 7));
    assert_ne!(mix(300, 7), mix(300, 8));
}

#[test]
fn the_mix_has_the_configured_proportions() {
    let tasks = mix(500, 1);
    let count = |k: TaskType| tasks.iter().filter(|t| t.task_type() == k).count();
    assert_eq!((count(TaskType::NoTool), count(TaskType::ToolRequired), count(TaskType::MultiStep)), (300, 100, 100));
    let inventory = tasks.iter().filter(|t| t.environment.as_deref() == Some("inventory")).count();
    assert_eq!(inventory, 50);
    // Half of the 50 multi-step calculator tasks need three dependent calls.
    let three = tasks.iter().filter(|t| t.gold_tool_calls.len() == 3).count();
    assert_eq!(three, 25);
    assert!(tasks.iter().filter(|t| t.gold_tool_calls.len() == 3).all(|t| t.id.starts_with("calc3-")));
    let no_inv = generate(&MixConfig { size: 100, tool_fraction: 1.0, multi_step_fraction: 1.0, inventory: false, three_step_fraction: 0.0, seed: 0, drill_words: false }).unwrap();
    assert!(no_inv.iter().all(|t| t.task_type() == TaskType::MultiStep && t.environment.is_none()));
    // Not all tool tasks come first: the order is shuffled.
    assert!(tasks[..300].iter().any(|t| t.requires_tool));
}

#[test]
fn tasks_are_distinct_valid_and_include_the_seed_phrasings() {
    let tasks = mix(2000, 3);
    let ids: HashSet<&str> = tasks.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids.len(), tasks.len());
    let prompts: HashSet<(&str, String)> =
        tasks.iter().map(|t| (t.prompt.as_str(), format!("{:?}", t.env_state))).collect();
    assert_eq!(prompts.len(), tasks.len());
    let registry = ToolRegistry::from_names(&["calculator", "inventory"], ExecLimits::default()).unwrap();
    for t in &tasks {
        validate_task(t).unwrap_or_else(|e| panic!("{}: {e}", t.id));
        registry.check_task(t).unwrap();
        assert!(t.expected_answer.as_deref().is_some_and(|a| !a.is_empty()));
    }
    assert!(tasks.iter().any(|t| t.prompt.starts_with("Use the calculator to compute ")));
    assert!(tasks.iter().any(|t| t.prompt.starts_with("Reply with exactly: ")));
    assert!(tasks.iter().any(|t| t.prompt.contains('.') && t.prompt.chars().any(|c| c.is_ascii_digit()) && t.gold_tool_calls[..].iter().flatten().any(|c| c.arguments["a"].is_f64())));
}

#[test]
fn gold_calls_executed_for_real_give_the_expected_answer() {
    let registry = ToolRegistry::from_names(&["calculator", "inventory"], ExecLimits::default()).unwrap();
    let tasks = mix(400, 11);
    for t in tasks.iter().filter(|t| t.requires_tool) {
        let mut session = registry.session(t).unwrap();
        let mut last = String::new();
        for (turn, step) in t.gold_tool_calls.iter().enumerate() {
            let text: String = step
                .iter()
                .map(|c| format!("<tool_call>\n{}\n</tool_call>", serde_json::json!({"name": c.name, "arguments": c.arguments})))
                .collect::<Vec<_>>()
                .join("\n");
            let parsed = session.parse(&text);
            let steps = session.execute(turn, &parsed.calls);
            assert!(steps.iter().all(|s| s.success && !s.repeated), "{}: {steps:?}", t.id);
            last = steps.last().unwrap().result.clone();
        }
        let answer = t.expected_answer.clone().unwrap();
        match t.environment.as_deref() {
            None => assert_eq!(last, answer, "{}", t.prompt),
            Some(_) => {
                assert!(last.ends_with(&format!(": {answer}")), "{}: {last}", t.prompt);
                assert_eq!(session.reward(), Some(1.0), "{}", t.prompt);
            }
        }
    }
}

#[test]
fn the_held_out_split_never_overlaps_and_is_stable() {
    let tasks = mix(1000, 5);
    let (train, held) = split_holdout(tasks.clone(), 0.2, 9);
    assert_eq!(train.len() + held.len(), 1000);
    assert!((150..250).contains(&held.len()), "{}", held.len());
    let held_prompts: HashSet<&str> = held.iter().map(|t| t.prompt.as_str()).collect();
    assert!(train.iter().all(|t| !held_prompts.contains(t.prompt.as_str()) || t.env_state.is_some()));
    // A task's side depends only on the task: the split of a subset agrees.
    let (_, held_small) = split_holdout(tasks[..300].to_vec(), 0.2, 9);
    assert!(held_small.iter().all(|t| held.contains(t)));
    // Duplicated tasks (e.g. from two generator seeds) land on one side.
    let (train2, held2) = split_holdout([mix(300, 5), mix(300, 5)].concat(), 0.2, 9);
    let held2: HashSet<&str> = held2.iter().map(|t| t.prompt.as_str()).collect();
    assert!(train2.iter().all(|t| !held2.contains(t.prompt.as_str()) || t.env_state.is_some()));
}

#[test]
fn impossible_fractions_are_refused() {
    let e = generate(&MixConfig { tool_fraction: 1.5, ..MixConfig::default() }).unwrap_err();
    assert_eq!(e.to_string(), "task mix: tool_fraction must be in [0, 1], got 1.5");
}

#[test]
fn drill_words_widen_the_no_tool_words_and_nothing_else() {
    use rlmesh_core::dataset::{DRILL_WORDS, WORDS};
    let cfg = |drill_words| MixConfig { size: 4000, tool_fraction: 0.5, multi_step_fraction: 0.0, inventory: false, three_step_fraction: 0.0, seed: 11, drill_words };
    let seed_words: HashSet<&str> = WORDS.iter().copied().collect();
    let drill: HashSet<&str> = DRILL_WORDS.iter().copied().collect();
    assert_eq!(drill.len(), DRILL_WORDS.len(), "no drill word twice");
    assert!(drill.is_disjoint(&seed_words));
    let words = |tasks: &[Task]| -> Vec<String> {
        tasks.iter().filter(|t| !t.requires_tool).flat_map(|t| t.expected_answer.as_deref().unwrap().split(' ').map(String::from).collect::<Vec<_>>()).collect()
    };
    // The one-word template "Repeat this word back to me and nothing else: W".
    let one_word = |tasks: &[Task]| tasks.iter().filter(|t| t.prompt.starts_with("Repeat this word back")).count();
    let plain = generate(&cfg(false)).unwrap();
    assert!(words(&plain).iter().all(|w| seed_words.contains(w.as_str())));
    assert!(one_word(&plain) <= WORDS.len());
    let drilled = generate(&cfg(true)).unwrap();
    let all = words(&drilled);
    assert!(all.iter().all(|w| seed_words.contains(w.as_str()) || drill.contains(w.as_str())));
    let share = all.iter().filter(|w| drill.contains(w.as_str())).count() as f64 / all.len() as f64;
    assert!((0.45..0.55).contains(&share), "half the words are drill words: {share}");
    // About 330 draws of the template over 326 words: far more than 30 prompts.
    assert!(one_word(&drilled) > 100, "{}", one_word(&drilled));
    // Tool tasks keep their proportions and stay gradable.
    assert_eq!(drilled.iter().filter(|t| t.requires_tool).count(), 2000);
    assert!(drilled.iter().all(|t| validate_task(t).is_ok()));
}
