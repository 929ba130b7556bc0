//! Loose comparison of answers and of argument values.
//!
//! The answer rule ([`answers_match`]), in order:
//! 1. the reply and the expected answer are equal after trimming, lower-casing
//!    and dropping trailing `.`;
//! 2. both parse as numbers within 1e-9 of each other (`"408" == "408.0"`);
//! 3. the reply *ends with* the expected answer at a word boundary, trailing
//!    punctuation ignored (`"… so the answer is 408."`, `"… is New York!"`);
//! 4. the expected answer is a number and the *last number* in the reply is
//!    within 1e-9 of it (`"408 apples"`, `"**408**"`, `"1,234"`).
//!
//! ```
//! use rlmesh_core::reward::answer::answers_match;
//! assert!(answers_match("17 * 24 = 408.0 in total", "408"));
//! assert!(!answers_match("408 or 409", "408"));
//! ```
use serde_json::Value;

/// Absolute tolerance of every numeric comparison.
pub const NUMERIC_TOLERANCE: f64 = 1e-9;

/// Punctuation ignored at the end of a reply or around a token.
const TRAILING: &[char] = &['.', ',', ';', ':', '!', '?', '"', '\'', '`', '*', ')', ']', '}', '$'];

/// Whether `reply` gives `expected` under the loose rule of this module.
pub fn answers_match(reply: &str, expected: &str) -> bool {
    let reply_n = normalise(reply);
    let expected_n = normalise(expected);
    if expected_n.is_empty() {
        return false;
    }
    if reply_n == expected_n {
        return true;
    }
    let expected_num = parse_number(&expected_n);
    if let (Some(a), Some(b)) = (parse_number(&reply_n), expected_num) {
        return close(a, b);
    }
    if let Some(prefix) = reply_n.strip_suffix(&expected_n) {
        if !prefix.chars().last().is_some_and(|c| c.is_alphanumeric() || c == '.' || c == '-') {
            return true;
        }
    }
    match (expected_num, last_number(&reply_n)) {
        (Some(e), Some(r)) => close(e, r),
        _ => false,
    }
}

/// Loose equality of two argument values: trimmed case-insensitive strings,
/// numbers (or numeric strings) within 1e-9, booleans as `true/false/1/0`,
/// JSON-equal arrays and objects.
pub fn loose_eq(a: &Value, b: &Value) -> bool {
    if let (Some(x), Some(y)) = (as_bool(a), as_bool(b)) {
        if matches!(a, Value::Bool(_)) || matches!(b, Value::Bool(_)) {
            return x == y;
        }
    }
    match (a, b) {
        (Value::String(x), Value::String(y)) if x.trim().eq_ignore_ascii_case(y.trim()) => true,
        (Value::Number(_) | Value::String(_), Value::Number(_) | Value::String(_)) => {
            match (as_number(a), as_number(b)) {
                (Some(x), Some(y)) => close(x, y),
                _ => false,
            }
        }
        _ => a == b,
    }
}

/// A number from trimmed text (`"408"`, `"-3.5"`, `"1,234"`, `"1e3"`); `None` for anything else.
pub fn parse_number(text: &str) -> Option<f64> {
    let t = text.trim().trim_end_matches('.');
    if !t.chars().any(|c| c.is_ascii_digit()) || !t.chars().all(|c| c.is_ascii_digit() || "+-.,eE".contains(c)) {
        return None;
    }
    let cleaned: String = if grouped_thousands(t) { t.chars().filter(|&c| c != ',').collect() } else { t.to_string() };
    cleaned.parse::<f64>().ok().filter(|v| v.is_finite())
}

/// True for `1,234` / `-12,345.5`: digits in groups of three separated by commas.
fn grouped_thousands(t: &str) -> bool {
    let body = t.trim_start_matches(['-', '+']);
    let int_part = body.split('.').next().unwrap_or("");
    let groups: Vec<&str> = int_part.split(',').collect();
    groups.len() > 1
        && !groups[0].is_empty()
        && groups[0].len() <= 3
        && groups[1..].iter().all(|g| g.len() == 3)
        && groups.iter().all(|g| g.chars().all(|c| c.is_ascii_digit()))
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= NUMERIC_TOLERANCE
}

fn normalise(text: &str) -> String {
    text.trim().trim_end_matches(TRAILING).trim().to_lowercase()
}

/// The last number written in `text` (commas between digit groups allowed).
fn last_number(text: &str) -> Option<f64> {
    let chars: Vec<char> = text.chars().collect();
    let mut last = None;
    let mut i = 0;
    while i < chars.len() {
        if chars[i].is_ascii_digit() {
            let mut start = i;
            if start > 0 && chars[start - 1] == '-' && (start < 2 || !chars[start - 2].is_alphanumeric()) {
                start -= 1;
            }
            let mut end = i;
            while end < chars.len()
                && (chars[end].is_ascii_digit()
                    || ((chars[end] == '.' || chars[end] == ',')
                        && chars.get(end + 1).is_some_and(|c| c.is_ascii_digit())))
            {
                end += 1;
            }
            let token: String = chars[start..end].iter().collect();
            last = parse_number(&token).or_else(|| parse_number(&token.replace(',', "")));
            i = end;
        } else {
            i += 1;
        }
    }
    last
}

fn as_number(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => parse_number(s),
        _ => None,
    }
}

fn as_bool(v: &Value) -> Option<bool> {
    match v {
        Value::Bool(b) => Some(*b),
        Value::Number(n) if n.as_f64() == Some(1.0) => Some(true),
        Value::Number(n) if n.as_f64() == Some(0.0) => Some(false),
        Value::String(s) => match s.trim().to_lowercase().as_str() {
            "true" | "1" => Some(true),
            "false" | "0" => Some(false),
            _ => None,
        },
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn numeric_forms_match() {
        assert!(answers_match("408", "408.0"));
        assert!(answers_match(" 408. ", "408"));
        assert!(answers_match("The answer is 1,234.", "1234"));
        assert!(answers_match("Result: -3.5", "-3.5"));
        assert!(!answers_match("409", "408"));
    }

    #[test]
    fn final_token_rule() {
        assert!(answers_match("17 * 24 = 408", "408"));
        assert!(answers_match("The capital is New York!", "new york"));
        assert!(!answers_match("It is 1408", "408"));
        assert!(!answers_match("408 is not it, 407 is", "408"));
        assert!(!answers_match("", "408"));
    }

    #[test]
    fn loose_values() {
        assert!(loose_eq(&json!(" Paris "), &json!("paris")));
        assert!(loose_eq(&json!(3), &json!(3.0)));
        assert!(loose_eq(&json!("3"), &json!(3)));
        assert!(loose_eq(&json!(true), &json!(1)));
        assert!(loose_eq(&json!("false"), &json!(false)));
        assert!(!loose_eq(&json!(true), &json!(0)));
        assert!(!loose_eq(&json!("1"), &json!("01x")));
        assert!(loose_eq(&json!({"a": [1, 2]}), &json!({"a": [1, 2]})));
        assert!(!loose_eq(&json!({"a": 1}), &json!({"a": 2})));
    }
}
