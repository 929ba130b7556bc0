//! The tokenizer (`tokenizer.json`) and the model's chat template, rendered
//! with minijinja exactly as transformers' `apply_chat_template` renders it
//! with jinja2 (`trim_blocks`, `lstrip_blocks`, loop controls, Python string
//! methods, and a `tojson` that writes what Python's `json.dumps` writes —
//! no HTML escaping, `", "` / `": "` separators, Python float repr).
use crate::error::{io_err, ModelError, Result};
use minijinja::value::{Kwargs, Value as JValue};
use minijinja::{Environment, Error as JError, ErrorKind};
use serde_json::Value;
use std::path::Path;

/// A tokenizer plus the chat template and special tokens of a model directory.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    template: Option<String>,
    tool_template: Option<String>,
    /// The templates compiled on first use (rendering is per rollout turn and per
    /// warm-up example; compiling the template each time cost more than rendering).
    compiled: [std::sync::OnceLock<std::result::Result<Environment<'static>, String>>; 2],
    special: serde_json::Map<String, Value>,
    stop_ids: Vec<u32>,
}

fn token_string(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

fn read_json(path: &Path) -> Result<Option<Value>> {
    if !path.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(io_err(path))?;
    serde_json::from_str(&text).map(Some).map_err(|e| ModelError::BadFile { path: path.to_path_buf(), message: format!("not valid JSON: {e}") })
}

fn ids_of(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|x| x as u32).into_iter().collect(),
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_u64).map(|x| x as u32).collect(),
        _ => vec![],
    }
}

impl Tokenizer {
    /// Load `tokenizer.json`, `tokenizer_config.json`, `chat_template.jinja` and
    /// `generation_config.json` (the latter three optional) from a model directory.
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join("tokenizer.json");
        if !path.exists() {
            return Err(ModelError::MissingFile { path, what: "tokenizer" });
        }
        let inner = tokenizers::Tokenizer::from_file(&path).map_err(|e| ModelError::BadFile { path: path.clone(), message: e.to_string() })?;
        let config = read_json(&dir.join("tokenizer_config.json"))?.unwrap_or(Value::Null);
        let mut special = serde_json::Map::new();
        for key in ["bos_token", "eos_token", "pad_token", "unk_token"] {
            if let Some(s) = config.get(key).and_then(token_string) {
                special.insert(key.to_string(), Value::String(s));
            }
        }
        let jinja = dir.join("chat_template.jinja");
        let (mut template, mut tool_template) = (None, None);
        if jinja.exists() {
            template = Some(std::fs::read_to_string(&jinja).map_err(io_err(&jinja))?);
        } else {
            match config.get("chat_template") {
                Some(Value::String(s)) => template = Some(s.clone()),
                Some(Value::Array(named)) => {
                    for t in named {
                        let name = t.get("name").and_then(Value::as_str).unwrap_or("");
                        let src = t.get("template").and_then(Value::as_str).map(str::to_string);
                        match name {
                            "default" => template = src,
                            "tool_use" => tool_template = src,
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        let mut stop_ids = vec![];
        let gen = read_json(&dir.join("generation_config.json"))?;
        stop_ids.extend(ids_of(gen.as_ref().and_then(|g| g.get("eos_token_id"))));
        if let Some(id) = special.get("eos_token").and_then(Value::as_str).and_then(|t| inner.token_to_id(t)) {
            stop_ids.push(id);
        }
        stop_ids.sort_unstable();
        stop_ids.dedup();
        Ok(Tokenizer { inner, template, tool_template, compiled: Default::default(), special, stop_ids })
    }

    /// Replace the chat template (e.g. a tool-calling template for a model whose own has none).
    pub fn set_chat_template(&mut self, source: impl Into<String>) {
        self.template = Some(source.into());
        self.tool_template = None;
        self.compiled = Default::default();
    }

    /// The chat template source, if the model has one.
    pub fn chat_template(&self) -> Option<&str> {
        self.template.as_deref()
    }

    /// Token ids that end an assistant turn (generation_config's eos ids and the eos token).
    pub fn stop_token_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The id of a token string, if it is one token.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Encode text (no special tokens added, as `apply_chat_template(tokenize=True)` does).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self.inner.encode(text, false).map_err(|e| ModelError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Decode ids to text.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner.decode(ids, skip_special_tokens).map_err(|e| ModelError::Tokenizer(e.to_string()))
    }

    /// Render a conversation with the chat template (transformers' `apply_chat_template(tokenize=False)`).
    ///
    /// `messages` are transformers-format message objects; `null` fields are dropped
    /// (a Python dict would not carry them).
    pub fn render(&self, messages: &[Value], tools: Option<&[Value]>, add_generation_prompt: bool) -> Result<String> {
        let (slot, source) = match (tools, &self.tool_template) {
            (Some(_), Some(t)) => (1, t),
            _ => (0, self.template.as_ref().ok_or_else(|| ModelError::Template("the tokenizer has no chat template".into()))?),
        };
        let env = self.compiled[slot].get_or_init(|| chat_environment(source.clone())).as_ref().map_err(|e| ModelError::Template(e.clone()))?;
        let messages: Vec<Value> = messages.iter().map(drop_nulls).collect();
        let mut ctx = self.special.clone();
        ctx.insert("messages".into(), Value::Array(messages));
        ctx.insert("tools".into(), tools.map(|t| Value::Array(t.to_vec())).unwrap_or(Value::Null));
        ctx.insert("add_generation_prompt".into(), Value::Bool(add_generation_prompt));
        render_with(env, &Value::Object(ctx))
    }

    /// Render and tokenise a conversation (`apply_chat_template(tokenize=True)`).
    pub fn render_ids(&self, messages: &[Value], tools: Option<&[Value]>, add_generation_prompt: bool) -> Result<(String, Vec<u32>)> {
        let text = self.render(messages, tools, add_generation_prompt)?;
        let ids = self.encode(&text)?;
        Ok((text, ids))
    }
}

fn drop_nulls(v: &Value) -> Value {
    match v {
        Value::Object(o) => Value::Object(o.iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k.clone(), v.clone())).collect()),
        other => other.clone(),
    }
}

/// Render a jinja chat template with transformers' environment settings.
pub fn render_template(source: &str, context: &Value) -> Result<String> {
    let env = chat_environment(source.to_string()).map_err(ModelError::Template)?;
    render_with(&env, context)
}

fn render_with(env: &Environment<'static>, context: &Value) -> Result<String> {
    let tmpl = env.get_template("chat").map_err(|e| ModelError::Template(e.to_string()))?;
    tmpl.render(JValue::from_serialize(context)).map_err(|e| ModelError::Template(e.to_string()))
}

/// transformers' jinja environment (trim/lstrip blocks, no auto-escape, Python string
/// methods, its `tojson` and `raise_exception`) holding `source` as template "chat".
fn chat_environment(source: String) -> std::result::Result<Environment<'static>, String> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(false);
    env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_filter("tojson", tojson_filter);
    env.add_function("raise_exception", |msg: String| -> std::result::Result<JValue, JError> {
        Err(JError::new(ErrorKind::InvalidOperation, msg))
    });
    env.add_template_owned("chat", source).map_err(|e| e.to_string())?;
    Ok(env)
}

fn tojson_filter(value: JValue, kwargs: Kwargs) -> std::result::Result<String, JError> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let v = serde_json::to_value(&value).map_err(|e| JError::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let style = PyJson { indent, sort_keys: sort_keys.unwrap_or(false), ensure_ascii: ensure_ascii.unwrap_or(false) };
    let mut out = String::new();
    style.write(&v, 0, &mut out);
    Ok(out)
}

/// Python's `json.dumps` output format.
struct PyJson {
    indent: Option<usize>,
    sort_keys: bool,
    ensure_ascii: bool,
}

impl PyJson {
    fn newline(&self, depth: usize, out: &mut String) {
        if let Some(n) = self.indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    }

    fn write(&self, v: &Value, depth: usize, out: &mut String) {
        let item_sep = if self.indent.is_some() { "," } else { ", " };
        match v {
            Value::Null => out.push_str("null"),
            Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Value::Number(n) => match (n.as_i64(), n.as_u64()) {
                (Some(i), _) => out.push_str(&i.to_string()),
                (_, Some(u)) => out.push_str(&u.to_string()),
                _ => out.push_str(&py_float_repr(n.as_f64().unwrap_or(f64::NAN))),
            },
            Value::String(s) => self.write_str(s, out),
            Value::Array(a) => {
                if a.is_empty() {
                    out.push_str("[]");
                    return;
                }
                out.push('[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push_str(item_sep);
                    }
                    self.newline(depth + 1, out);
                    self.write(x, depth + 1, out);
                }
                self.newline(depth, out);
                out.push(']');
            }
            Value::Object(o) => {
                if o.is_empty() {
                    out.push_str("{}");
                    return;
                }
                let mut entries: Vec<(&String, &Value)> = o.iter().collect();
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                out.push('{');
                for (i, (k, x)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.push_str(item_sep);
                    }
                    self.newline(depth + 1, out);
                    self.write_str(k, out);
                    out.push_str(": ");
                    self.write(x, depth + 1, out);
                }
                self.newline(depth, out);
                out.push('}');
            }
        }
    }

    fn write_str(&self, s: &str, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{08}' => out.push_str("\\b"),
                '\u{0c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                c if self.ensure_ascii && !c.is_ascii() => {
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        out.push_str(&format!("\\u{:04x}", unit));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// Python's `repr(float)` as `json.dumps` writes it (`1.0`, `0.1`, `1e-05`, `1e+16`, `NaN`, `Infinity`).
pub fn py_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').expect("scientific format has an exponent");
    let exp: i32 = exp.parse().expect("integer exponent");
    if (-4..16).contains(&exp) {
        let plain = format!("{f}");
        if plain.contains('.') {
            plain
        } else {
            format!("{plain}.0")
        }
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_python() {
        // Expected strings are what CPython 3.11 prints for repr(x).
        for (x, s) in [(1.0, "1.0"), (0.1, "0.1"), (1e-5, "1e-05"), (1e16, "1e+16"), (123.456, "123.456"), (-0.0, "-0.0"), (1.5e-7, "1.5e-07"), (0.0001, "0.0001"), (2.5e20, "2.5e+20")] {
            assert_eq!(py_float_repr(x), s, "{x}");
        }
    }

    #[test]
    fn tojson_is_python_json_dumps() {
        let ctx = serde_json::json!({"x": {"a": "<&>\"é\n", "b": [1, 2.0, null, true], "c": {}}});
        let out = render_template("{{ x | tojson }}|{{ x.b | tojson(indent=2) }}", &ctx).unwrap();
        assert_eq!(out, "{\"a\": \"<&>\\\"é\\n\", \"b\": [1, 2.0, null, true], \"c\": {}}|[\n  1,\n  2.0,\n  null,\n  true\n]");
    }

    #[test]
    fn raise_exception_is_an_error() {
        let err = render_template("{{ raise_exception('no system role') }}", &serde_json::json!({})).unwrap_err();
        assert!(err.to_string().contains("no system role"), "{err}");
    }
}
