//! The `<tool_call>` parser never panics and keeps its invariants on random
//! text, on tag-rich token soup and on mutations of valid model outputs; the
//! executor copes with whatever it produces.
use proptest::prelude::*;
use rlmesh_core::tools::parse::{parse_turn, ParsedTurn, OPEN};
use rlmesh_core::tools::{calculator, inventory::Inventory, Environment, ExecLimits, Tool, ToolRegistry};
use rlmesh_core::Task;
use serde_json::json;

fn tools() -> Vec<Tool> {
    vec![calculator::tool()]
}

/// Invariants of every parse, whatever the input.
fn check_invariants(text: &str, turn: &ParsedTurn, tools: &[Tool]) {
    let well_formed: Vec<_> = turn.calls.iter().filter(|c| c.is_well_formed()).collect();
    for c in &turn.calls {
        if c.error.is_none() {
            let tool = tools.iter().find(|t| t.name() == c.name).expect("a runnable call names a known tool");
            assert!(tool.spec.check_arguments(&c.arguments).is_ok());
        }
        if c.is_well_formed() {
            assert!(!c.name.is_empty() && c.arguments.is_object());
        }
    }
    let message = turn.message();
    assert_eq!(message.tool_calls.map_or(0, |v| v.len()), well_formed.len());
    assert_eq!(turn.format_errors().len(), turn.calls.len() - well_formed.len());
    assert!(turn.calls.len() <= text.matches(OPEN).count());
    if well_formed.len() == turn.calls.len() {
        assert!(!turn.content.contains(OPEN), "content {:?} of {:?}", turn.content, text);
    }
    if turn.calls.is_empty() {
        assert_eq!(turn.content, text);
    }
}

fn piece() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("<tool_call>".to_string()),
        Just("</tool_call>".to_string()),
        Just("<tool_call>\n{\"name\": \"calculator\", \"arguments\": ".to_string()),
        Just("{\"operation\": \"add\", \"a\": 1, \"b\": 2}".to_string()),
        Just("}\n</tool_call>".to_string()),
        Just("{".to_string()),
        Just("}".to_string()),
        Just("[".to_string()),
        Just("\"".to_string()),
        Just("\\".to_string()),
        Just("\"name\": ".to_string()),
        Just("\"arguments\": ".to_string()),
        Just("null".to_string()),
        Just("1e999".to_string()),
        Just("é漢🙂".to_string()),
        Just("\n".to_string()),
        Just("<tool_".to_string()),
        "[ -~]{0,8}",
        any::<String>().prop_map(|s| s.chars().take(6).collect()),
    ]
}

fn valid_call() -> impl Strategy<Value = String> {
    (0usize..5, -1000i64..1000, prop_oneof![(-1000i64..1000).prop_map(|b| json!(b)), (-1e6f64..1e6).prop_map(|b| json!(b))])
        .prop_map(|(op, a, b)| {
            let op = calculator::Operation::ALL[op].as_str();
            let body = json!({"name": "calculator", "arguments": {"operation": op, "a": a, "b": b}});
            format!("<tool_call>\n{body}\n</tool_call>")
        })
}

/// A valid model output: optional text, then 1–3 calls separated by newlines.
fn valid_output() -> impl Strategy<Value = (String, String, usize)> {
    ("[A-Za-z ,.]{0,30}", prop::collection::vec(valid_call(), 1..4)).prop_map(|(content, calls)| {
        let content = content.trim().to_string();
        let sep = if content.is_empty() { "" } else { "\n" };
        (format!("{content}{sep}{}", calls.join("\n")), content, calls.len())
    })
}

#[derive(Clone, Debug)]
enum Mutation {
    Delete(usize),
    Insert(usize, char),
    Truncate(usize),
    Duplicate(usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let ch = prop_oneof![Just('<'), Just('>'), Just('/'), Just('{'), Just('}'), Just('"'), Just(','), Just('\\'), Just('é'), Just('🙂'), any::<char>()];
    prop_oneof![
        any::<usize>().prop_map(Mutation::Delete),
        (any::<usize>(), ch).prop_map(|(i, c)| Mutation::Insert(i, c)),
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), 1usize..20).prop_map(|(i, n)| Mutation::Duplicate(i, n)),
    ]
}

fn mutate(text: &str, mutations: &[Mutation]) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    for m in mutations {
        let n = chars.len().max(1);
        match *m {
            Mutation::Delete(i) if !chars.is_empty() => {
                chars.remove(i % chars.len());
            }
            Mutation::Delete(_) => {}
            Mutation::Insert(i, c) => chars.insert(i % (chars.len() + 1), c),
            Mutation::Truncate(i) => chars.truncate(i % n),
            Mutation::Duplicate(i, len) => {
                let start = i % n;
                let copy: Vec<char> = chars.iter().skip(start).take(len).cloned().collect();
                chars.splice(start..start, copy);
            }
        }
    }
    chars.into_iter().collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_text_never_panics(text in any::<String>()) {
        let tools = tools();
        check_invariants(&text, &parse_turn(&text, &tools), &tools);
    }

    #[test]
    fn tag_soup_never_panics(pieces in prop::collection::vec(piece(), 0..40)) {
        let text: String = pieces.concat();
        let tools = tools();
        check_invariants(&text, &parse_turn(&text, &tools), &tools);
    }

    #[test]
    fn valid_outputs_parse_exactly((text, content, n) in valid_output()) {
        let tools = tools();
        let turn = parse_turn(&text, &tools);
        check_invariants(&text, &turn, &tools);
        prop_assert_eq!(&turn.content, &content);
        prop_assert_eq!(turn.calls.len(), n);
        prop_assert!(turn.calls.iter().all(|c| c.error.is_none()), "{:?}", turn.calls);
    }

    #[test]
    fn mutated_valid_outputs_never_panic((text, _, _) in valid_output(), ms in prop::collection::vec(mutation(), 1..6)) {
        let text = mutate(&text, &ms);
        let tools = tools();
        check_invariants(&text, &parse_turn(&text, &tools), &tools);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn executing_whatever_was_parsed_gives_one_step_per_block(
        (text, _, _) in valid_output(),
        ms in prop::collection::vec(mutation(), 0..6),
    ) {
        let text = mutate(&text, &ms);
        let registry = ToolRegistry::from_names(&["calculator", "inventory"], ExecLimits::default()).unwrap();
        let task = Task {
            id: "fuzz".into(), prompt: "p".into(), requires_tool: true, allowed_tools: vec![],
            gold_tool_calls: vec![], expected_answer: None, environment: Some("inventory".into()),
            env_state: Some(Inventory::state(&[("apples", 3)], &[])),
            ..Default::default()
        };
        let mut session = registry.session(&task).unwrap();
        prop_assert_eq!(session.tools().len(), 1 + Inventory::methods().len());
        let turn = session.parse(&text);
        let steps = session.execute(0, &turn.calls);
        prop_assert_eq!(steps.len(), turn.calls.len());
        for (i, s) in steps.iter().enumerate() {
            prop_assert_eq!(s.index, i);
            prop_assert_eq!(s.success, s.error.is_none());
            if !s.success {
                prop_assert!(s.result.starts_with("{\"error\": "), "{}", s.result);
                prop_assert!(serde_json::from_str::<serde_json::Value>(&s.result).is_ok());
            }
        }
    }
}
