//! The seed's task mix: a deterministic generator of calculator, inventory
//! and no-tool tasks.
//!
//! The seed's mix puts tool-required tasks (`"Use the calculator to compute
//! 17 * 24."`) next to no-tool tasks (`"Reply with exactly: hello"`) so that
//! the policy learns *when* to call, not just how; [`MixConfig`] sets the ratio
//! and adds multi-step tasks (two calculator calls for `(a + b) * c`, three for
//! `((a + b) * c) - d`, or
//! inventory updates that need a lookup before the write). Generation is
//! deterministic for a seed and never repeats a task.
//!
//! [`split_holdout`] sets aside a held-out share that never overlaps the rest.
use super::DatasetError;
use crate::task::{GoldCall, Task};
use crate::tools::calculator::{self, CalculatorArgs, Operation};
use crate::tools::inventory::{self, Inventory, ItemArgs, SetArgs};
use serde::Serialize;
use serde_json::{Number, Value};
use std::collections::HashSet;

/// How many tasks of each kind to generate.
#[derive(Clone, Debug, PartialEq)]
pub struct MixConfig {
    /// Number of tasks.
    pub size: usize,
    /// Share of tasks that need a tool (single- and multi-step), in `[0, 1]`.
    pub tool_fraction: f64,
    /// Share of the tool tasks that need two or more steps, in `[0, 1]`.
    pub multi_step_fraction: f64,
    /// Whether multi-step tasks include inventory tasks (half of them; needs
    /// the `inventory` environment) besides two-call calculator tasks.
    pub inventory: bool,
    /// Share of the multi-step calculator tasks that need three dependent calls
    /// (`((a + b) × c) − d`) instead of two, in `[0, 1]`.
    pub three_step_fraction: f64,
    /// Seed of the generator.
    pub seed: u64,
    /// Whether half the words of no-tool tasks come from [`DRILL_WORDS`], a
    /// list no task of a mix without it uses. Meant for a warm-up's pool: with
    /// the 30 seed words alone a one-word template has 30 prompts, the pool
    /// keeps those the held-out set lacks, and a policy can memorise their
    /// answers instead of learning to copy.
    pub drill_words: bool,
}

impl Default for MixConfig {
    fn default() -> Self {
        MixConfig { size: 512, tool_fraction: 0.5, multi_step_fraction: 0.25, inventory: true, three_step_fraction: 0.0, seed: 0, drill_words: false }
    }
}

/// SplitMix64: a small, fast, well-mixed generator; deterministic everywhere.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `lo..=hi`.
    pub(crate) fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as i64
    }
    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.range(0, items.len() as i64 - 1) as usize]
    }
}

/// What a task is made of before it gets an id.
struct Draft {
    prompt: String,
    gold: Vec<Vec<GoldCall>>,
    answer: String,
    env_state: Option<Value>,
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    NoTool,
    Calc,
    Calc2,
    Calc3,
    Inventory,
}

impl Kind {
    fn prefix(self) -> &'static str {
        match self {
            Kind::NoTool => "notool",
            Kind::Calc => "calc",
            Kind::Calc2 => "calc2",
            Kind::Calc3 => "calc3",
            Kind::Inventory => "inv",
        }
    }
}

/// Generates the task mix: exactly `round(size·tool_fraction)` tool tasks, of
/// which `round(·multi_step_fraction)` multi-step, in a seeded random order,
/// with no two tasks alike. Ids are `<kind>-<position>`.
pub fn generate(cfg: &MixConfig) -> Result<Vec<Task>, DatasetError> {
    for (name, v) in
        [("tool_fraction", cfg.tool_fraction), ("multi_step_fraction", cfg.multi_step_fraction), ("three_step_fraction", cfg.three_step_fraction)]
    {
        if !(0.0..=1.0).contains(&v) {
            return Err(DatasetError::Config(format!("{name} must be in [0, 1], got {v}")));
        }
    }
    let n_tool = (cfg.size as f64 * cfg.tool_fraction).round() as usize;
    let n_multi = (n_tool as f64 * cfg.multi_step_fraction).round() as usize;
    let n_inv = if cfg.inventory { n_multi / 2 } else { 0 };
    let n_three = ((n_multi - n_inv) as f64 * cfg.three_step_fraction).round() as usize;
    let counts = [
        (Kind::NoTool, cfg.size - n_tool),
        (Kind::Calc, n_tool - n_multi),
        (Kind::Calc2, n_multi - n_inv - n_three),
        (Kind::Calc3, n_three),
        (Kind::Inventory, n_inv),
    ];
    let mut rng = Rng(cfg.seed);
    let mut seen = HashSet::new();
    let mut tasks = Vec::with_capacity(cfg.size);
    for (kind, count) in counts {
        for _ in 0..count {
            let task = (0..1000)
                .map(|_| make_task(kind, draft(kind, &mut rng, cfg.drill_words)))
                .find(|t| seen.insert(task_key(t)))
                .ok_or_else(|| {
                    DatasetError::Config(format!("cannot find {count} distinct {} tasks; lower the size", kind.prefix()))
                })?;
            tasks.push(task);
        }
    }
    for i in (1..tasks.len()).rev() {
        let j = rng.range(0, i as i64) as usize;
        tasks.swap(i, j);
    }
    for (i, t) in tasks.iter_mut().enumerate() {
        t.id = format!("{}-{i:05}", t.id);
    }
    Ok(tasks)
}

fn make_task(kind: Kind, d: Draft) -> Task {
    let allowed_tools = match kind {
        Kind::NoTool => vec![],
        Kind::Calc | Kind::Calc2 | Kind::Calc3 => vec![calculator::NAME.to_string()],
        Kind::Inventory => ["list_items", "get_stock", "set_stock"].map(String::from).to_vec(),
    };
    Task {
        id: kind.prefix().to_string(),
        prompt: d.prompt,
        requires_tool: kind != Kind::NoTool,
        allowed_tools,
        gold_tool_calls: d.gold,
        expected_answer: Some(d.answer),
        environment: (kind == Kind::Inventory).then(|| inventory::NAME.to_string()),
        env_state: d.env_state,
        ..Task::default()
    }
}

/// What makes two tasks the same: prompt (its messages, when it has them)
/// and environment state.
pub fn task_key(t: &Task) -> String {
    let mut key = t.prompt.clone();
    if !t.messages.is_empty() {
        let messages = serde_json::to_string(&t.messages).unwrap_or_else(|e| unreachable!("messages serialise to JSON: {e}"));
        key = format!("{key}\u{0}{messages}");
    }
    match &t.env_state {
        Some(s) => format!("{key}\u{0}{s}"),
        None => key,
    }
}

fn draft(kind: Kind, rng: &mut Rng, drill: bool) -> Draft {
    match kind {
        Kind::NoTool => no_tool(rng, drill),
        Kind::Calc => calc(rng),
        Kind::Calc2 => calc2(rng),
        Kind::Calc3 => calc3(rng),
        Kind::Inventory => inventory_task(rng),
    }
}

/// The seed mix's words for no-tool tasks.
pub const WORDS: &[&str] = &[
    "hello", "goodbye", "yes", "no", "blue", "green", "river", "mountain", "coffee", "pencil", "window", "garden",
    "planet", "silver", "orange", "tiger", "rocket", "paper", "music", "winter", "summer", "cloud", "bridge",
    "candle", "forest", "island", "lemon", "violin", "harbor", "meadow",
];

/// Words for warm-up drills ([`MixConfig::drill_words`]); none is in [`WORDS`].
pub const DRILL_WORDS: &[&str] = &[
    "apple", "anchor", "arrow", "autumn", "badge", "bakery", "balloon", "bamboo", "banner", "basket", "beach",
    "beacon", "bell", "berry", "blanket", "bottle", "breeze", "brick", "broom", "bubble", "butter", "button",
    "cabin", "cactus", "camera", "canyon", "carpet", "castle", "cedar", "chair", "chalk", "cherry", "circle",
    "clock", "clover", "comet", "compass", "copper", "cotton", "crayon", "crystal", "cushion", "daisy", "desert",
    "diamond", "dolphin", "dragon", "drum", "eagle", "echo", "emerald", "engine", "falcon", "feather", "fern",
    "festival", "flag", "flame", "flute", "fossil", "fountain", "fox", "galaxy", "ginger", "glacier", "globe",
    "goose", "granite", "grape", "gravel", "guitar", "hammer", "hazel", "helmet", "honey", "horizon", "iris",
    "ivory", "jacket", "jasmine", "jelly", "jungle", "kettle", "kitten", "ladder", "lantern", "lava", "leaf",
    "library", "lily", "lizard", "magnet", "mango", "maple", "marble", "meteor", "mirror", "mist", "moon", "moss",
    "nectar", "needle", "nest", "noodle", "oak", "ocean", "olive", "onion", "orchid", "otter", "owl", "paddle",
    "palace", "panda", "parrot", "peach", "pebble", "penguin", "pepper", "piano", "pillow", "pine", "pirate",
    "plum", "pocket", "pond", "poppy", "potato", "puzzle", "quartz", "quilt", "rabbit", "radar", "rain", "raven",
    "reef", "ribbon", "robin", "rose", "ruby", "saddle", "salmon", "sand", "scarf", "shadow", "shell", "shovel",
    "sky", "sparrow", "spider", "spoon", "spruce", "squirrel", "star", "stone", "storm", "sugar", "sunset", "swan",
    "tablet", "teapot", "thunder", "timber", "tomato", "torch", "tower", "trail", "tulip", "turtle", "umbrella",
    "valley", "velvet", "village", "volcano", "wagon", "walnut", "whale", "wheat", "whistle", "willow", "wind",
    "wolf", "wool", "yarn", "zebra", "acorn", "almond", "amber", "arch", "atlas", "avocado", "bagel", "banjo",
    "barrel", "bison", "blossom", "boulder", "bracelet", "breadcrumb", "buckle", "cable", "canoe", "caramel",
    "carrot", "cello", "cereal", "cinnamon", "cobalt", "coconut", "coral", "cricket", "dune", "ember", "fabric",
    "fig", "firefly", "frost", "gazelle", "geyser", "harp", "hedgehog", "hippo", "igloo", "jade", "kayak", "kiwi",
    "koala", "lagoon", "leopard", "lotus", "lynx", "mantle", "marsh", "melon", "mint", "mitten", "moth", "muffin",
    "mustard", "nickel", "nutmeg", "oasis", "opal", "orbit", "panther", "papaya", "pearl", "pecan", "pelican",
    "pepperoni", "pickle", "pigeon", "pinecone", "plaza", "prairie", "pumpkin", "quail", "quiver", "raccoon",
    "raisin", "rattle", "reindeer", "rhubarb", "saffron", "sapphire", "satin", "scooter", "seashell", "sequoia",
    "sesame", "skate", "sled", "snowflake", "sonnet", "spinach", "sprout", "stork", "summit", "tambourine",
    "tangerine", "thistle", "thyme", "toffee", "topaz", "tractor", "trumpet", "tundra", "turnip", "vanilla", "vase",
    "walrus", "waffle", "wizard", "yacht", "yogurt", "zinc",
];

/// A no-tool task: the answer is text from the prompt, so it needs no tool and
/// no knowledge a policy trained from scratch could lack — a held-out no-tool
/// task tests the decision not to call, and copying. With `drill`, each word
/// is from [`DRILL_WORDS`] half the time (without it, the draws are as they
/// always were, so a mix's tasks do not change).
fn no_tool(rng: &mut Rng, drill: bool) -> Draft {
    let word = |rng: &mut Rng| if drill && rng.chance(0.5) { *rng.pick(DRILL_WORDS) } else { *rng.pick(WORDS) };
    let w = word(rng).to_string();
    let words: Vec<&str> = (0..rng.range(2, 3)).map(|_| word(rng)).collect();
    let phrase = words.join(" ");
    let (prompt, answer) = match rng.range(0, 5) {
        0 => (format!("Reply with exactly: {w}"), w),
        1 => (format!("Reply with exactly: {phrase}"), phrase),
        2 => (format!("Repeat this word back to me and nothing else: {w}"), w),
        3 => (format!("Repeat after me: {phrase}"), phrase),
        4 => (format!("Say \"{phrase}\" and nothing else."), phrase),
        _ => (format!("Echo this phrase back without any tool: {phrase}"), phrase),
    };
    Draft { prompt, gold: vec![], answer, env_state: None }
}

fn gold(name: &str, args: impl Serialize) -> GoldCall {
    let arguments = serde_json::to_value(args).unwrap_or_else(|e| unreachable!("argument structs serialise: {e}"));
    GoldCall { name: name.to_string(), arguments }
}

fn calc_call(op: Operation, a: &Number, b: &Number) -> (GoldCall, String) {
    let result = calculator::calculate(op, a, b).unwrap_or_else(|e| unreachable!("generated operands are valid: {e}"));
    (gold(calculator::NAME, CalculatorArgs { operation: op, a: a.clone(), b: b.clone() }), result)
}

/// An operand: an integer in `lo..=hi`, or (with probability `p_decimal`) a number with one decimal.
fn operand(rng: &mut Rng, lo: i64, hi: i64, p_decimal: f64) -> Number {
    if rng.chance(p_decimal) {
        let tenths = rng.range(lo * 10, hi * 10) / 10 * 10 + rng.range(1, 9);
        Number::from_f64(tenths as f64 / 10.0).unwrap_or_else(|| unreachable!("finite"))
    } else {
        Number::from(rng.range(lo, hi))
    }
}

fn calc(rng: &mut Rng) -> Draft {
    let op = *rng.pick(Operation::ALL);
    let (a, b) = match op {
        Operation::Add | Operation::Subtract | Operation::Multiply => (operand(rng, 2, 999, 0.2), operand(rng, 2, 999, 0.2)),
        Operation::Divide if rng.chance(0.7) => {
            let (b, q) = (rng.range(2, 50), rng.range(2, 99));
            (Number::from(b * q), Number::from(b))
        }
        Operation::Divide => (operand(rng, 1, 999, 0.2), Number::from(rng.range(2, 99))),
        Operation::Power => (Number::from(rng.range(2, 12)), Number::from(rng.range(2, 4))),
    };
    let s = op.symbol();
    let prompt = match rng.range(0, 3) {
        0 => format!("Use the calculator to compute {a} {s} {b}."),
        1 => format!("What is {a} {s} {b}? Use the calculator tool."),
        2 => format!("Calculate {a} {s} {b} using the calculator."),
        _ => match op {
            Operation::Add => format!("Use the calculator to add {a} and {b}."),
            Operation::Subtract => format!("Use the calculator to subtract {b} from {a}."),
            Operation::Multiply => format!("Use the calculator to multiply {a} by {b}."),
            Operation::Divide => format!("Use the calculator to divide {a} by {b}."),
            Operation::Power => format!("Use the calculator to raise {a} to the power of {b}."),
        },
    };
    let (call, answer) = calc_call(op, &a, &b);
    Draft { prompt, gold: vec![vec![call]], answer, env_state: None }
}

fn calc2(rng: &mut Rng) -> Draft {
    let ops = [Operation::Add, Operation::Subtract, Operation::Multiply];
    let (op1, op2) = (*rng.pick(&ops), *rng.pick(&ops));
    let (a, b, c) = (Number::from(rng.range(2, 99)), Number::from(rng.range(2, 99)), Number::from(rng.range(2, 99)));
    let (first, r1) = calc_call(op1, &a, &b);
    let r1_num = Number::from(r1.parse::<i64>().unwrap_or_else(|e| unreachable!("integer ops give integers: {e}")));
    let (second, answer) = calc_call(op2, &r1_num, &c);
    let (s1, s2) = (op1.symbol(), op2.symbol());
    let prompt = if rng.chance(0.5) {
        format!("Use the calculator to compute ({a} {s1} {b}) {s2} {c}.")
    } else {
        format!("Compute ({a} {s1} {b}) {s2} {c} step by step with the calculator, one operation per call.")
    };
    Draft { prompt, gold: vec![vec![first], vec![second]], answer, env_state: None }
}

/// Three dependent calls: `(a + b) × c`, then `− d` — each call's operand is the
/// previous call's result, so a wrong early call spoils every later one.
fn calc3(rng: &mut Rng) -> Draft {
    let (op1, op2, op3) = (*rng.pick(&[Operation::Add, Operation::Subtract]), Operation::Multiply, Operation::Subtract);
    let (a, b, c) = (Number::from(rng.range(10, 99)), Number::from(rng.range(2, 9)), Number::from(rng.range(2, 9)));
    let d = Number::from(rng.range(2, 99));
    let int = |r: &str| Number::from(r.parse::<i64>().unwrap_or_else(|e| unreachable!("integer ops give integers: {e}")));
    let (first, r1) = calc_call(op1, &a, &b);
    let (second, r2) = calc_call(op2, &int(&r1), &c);
    let (third, answer) = calc_call(op3, &int(&r2), &d);
    let s1 = op1.symbol();
    let prompt = match rng.range(0, 2) {
        0 => format!("Use the calculator to compute ({a} {s1} {b}) * {c}, then subtract {d}. Reply with the final number."),
        1 => format!("With the calculator, one operation per call: take {a} {s1} {b}, multiply the result by {c}, then subtract {d}. Reply with the final number."),
        _ => format!("Compute (({a} {s1} {b}) * {c}) - {d} step by step with the calculator and reply with the result."),
    };
    Draft { prompt, gold: vec![vec![first], vec![second], vec![third]], answer, env_state: None }
}

const ITEMS: &[&str] = &["apples", "bananas", "cherries", "dates", "eggs", "flour", "grapes", "honey", "lemons", "mangoes"];

fn inventory_task(rng: &mut Rng) -> Draft {
    let mut items: Vec<&str> = Vec::new();
    while items.len() < 3 {
        let it = *rng.pick(ITEMS);
        if !items.contains(&it) {
            items.push(it);
        }
    }
    let stock: Vec<(&str, i64)> = items.iter().map(|&i| (i, rng.range(0, 60))).collect();
    let get = |item: &str| gold("get_stock", ItemArgs { item: item.to_string() });
    let set = |item: &str, quantity: i64| gold("set_stock", SetArgs { item: item.to_string(), quantity });
    let (x, sx) = stock[0];
    let (prompt, gold_calls, target, total) = match rng.range(0, 2) {
        0 => {
            let n = rng.range(2, 30);
            let p = format!("We just received {n} more {x}. Check the current stock of {x}, update it to the new total, and reply with the new total.");
            (p, vec![vec![get(x)], vec![set(x, sx + n)]], x, sx + n)
        }
        1 if sx > 0 => {
            let n = rng.range(1, sx);
            let p = format!("We sold {n} {x} today. Check the current stock of {x}, update it to what is left, and reply with the new stock.");
            (p, vec![vec![get(x)], vec![set(x, sx - n)]], x, sx - n)
        }
        _ => {
            let ((y, sy), (z, _)) = (stock[1], stock[2]);
            let p = format!("Set the stock of {z} to the combined stock of {x} and {y}, then reply with the new stock of {z}.");
            (p, vec![vec![get(x), get(y)], vec![set(z, sx + sy)]], z, sx + sy)
        }
    };
    Draft {
        prompt,
        gold: gold_calls,
        answer: total.to_string(),
        env_state: Some(Inventory::state(&stock, &[(target, total)])),
    }
}

/// Splits tasks into (train, held-out): a task is held out when a seeded hash
/// of its prompt and environment state falls in the `fraction` share, so equal
/// tasks always land on the same side and the sides never overlap.
pub fn split_holdout(tasks: Vec<Task>, fraction: f64, seed: u64) -> (Vec<Task>, Vec<Task>) {
    tasks.into_iter().partition(|t| {
        let mut h: u64 = 0xCBF2_9CE4_8422_2325 ^ seed;
        for b in task_key(t).bytes() {
            h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01B3);
        }
        Rng(h).unit() >= fraction
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_matches_the_reference_sequence() {
        // First outputs of SplitMix64 seeded with 1234567 (Vigna's reference implementation).
        let mut r = Rng(1234567);
        assert_eq!(r.next_u64(), 6457827717110365317);
        assert_eq!(r.next_u64(), 3203168211198807973);
    }

    #[test]
    fn operands_with_decimals_have_one_decimal_place() {
        let mut r = Rng(3);
        for _ in 0..200 {
            let n = operand(&mut r, 2, 999, 1.0);
            let s = n.to_string();
            let (int, frac) = s.split_once('.').unwrap();
            assert!((2..=999).contains(&int.parse::<i64>().unwrap()), "{s}");
            assert_eq!(frac.len(), 1, "{s}");
            assert_ne!(frac, "0", "{s}");
        }
    }
}
