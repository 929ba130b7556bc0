//! TOML configuration files with errors that name the file, line and field.
//!
//! A file is read twice: once into a tree that keeps the byte span of every
//! key and value (`Doc`), once into its typed struct. A serde error carries
//! a span, which the tree turns into a field path (`learner.placement[1].gpus`);
//! a semantic check ([`Invalid`], from a `validate` on plain data) names a
//! path, which the tree turns into a line:
//!
//! ```text
//! deploy/bad.toml:12: field "learner.ranks": 20 ranks need 20 learner devices, the placement gives 8 (node "n0": 8)
//! ```
//!
//! A file is at most [`MAX_CONFIG_BYTES`], refused before it is read.
use serde::de::{DeserializeOwned, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use std::fmt;
use std::ops::Range;
use std::path::Path;
use toml::Spanned;

/// A configuration file that could not be read, parsed or validated.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{file}: {error}")]
    Io {
        /// The file, as given.
        file: String,
        /// The OS error.
        error: std::io::Error,
    },
    /// The file is not valid TOML.
    #[error("{file}:{line}: {message}")]
    Syntax {
        /// The file, as given.
        file: String,
        /// 1-based line.
        line: usize,
        /// What the TOML parser expected.
        message: String,
    },
    /// A field is missing, unknown, of the wrong type or inconsistent with others.
    #[error("{file}:{line}: field \"{field}\": {message}")]
    Field {
        /// The file, as given.
        file: String,
        /// 1-based line of the field (of its nearest enclosing table when the field is absent).
        line: usize,
        /// Dotted path of the field, e.g. `learner.placement[0].gpus`.
        field: String,
        /// What is wrong.
        message: String,
    },
}

/// A semantic error found on plain data: which field and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("field \"{field}\": {message}")]
pub struct Invalid {
    /// Dotted path of the field, e.g. `learner.ranks`.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl Invalid {
    /// An error about `field`.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Invalid {
        Invalid { field: field.into(), message: message.into() }
    }
}

/// Reads `path` and parses it as `T`, running `validate` on the result.
pub fn load<T: DeserializeOwned>(path: &Path, validate: impl FnOnce(&T) -> Result<(), Invalid>) -> Result<T, ConfigError> {
    let file = path.display().to_string();
    let text = read_bounded(path, &file)?;
    parse(&file, &text, validate)
}

/// Parses `text` (named `file` in errors) as `T`, running `validate` on the result.
pub fn parse<T: DeserializeOwned>(file: &str, text: &str, validate: impl FnOnce(&T) -> Result<(), Invalid>) -> Result<T, ConfigError> {
    if text.len() > MAX_CONFIG_BYTES {
        return Err(too_large(file, text.len() as u64));
    }
    // toml 0.8's `Spanned` cannot take the keys of a dotted table header
    // (`[env.learner]`: "expected a borrowed string"); such a file is still
    // valid TOML, and its errors then name the field without a line of its own.
    let doc = match Doc::parse(text) {
        Ok(d) => d,
        Err(_) if toml::from_str::<toml::Table>(text).is_ok() => Doc { entries: Vec::new() },
        Err(e) => return Err(syntax_error(file, text, &e)),
    };
    let value: T = toml::from_str(text).map_err(|e| doc.serde_error(file, text, &e))?;
    validate(&value).map_err(|e| doc.field_error(file, text, e))?;
    Ok(value)
}

/// Largest configuration file (16 MiB): a 100000-process topology takes about 5 MiB.
pub const MAX_CONFIG_BYTES: usize = 16 << 20;

/// Reading `path` refuses a file larger than [`MAX_CONFIG_BYTES`] before reading it.
fn read_bounded(path: &Path, file: &str) -> Result<String, ConfigError> {
    let io = |error| ConfigError::Io { file: file.to_string(), error };
    let len = std::fs::metadata(path).map_err(io)?.len();
    if len > MAX_CONFIG_BYTES as u64 {
        return Err(too_large(file, len));
    }
    std::fs::read_to_string(path).map_err(io)
}

fn too_large(file: &str, len: u64) -> ConfigError {
    let message = format!("{len} bytes, more than the {} MiB a configuration file may have", MAX_CONFIG_BYTES >> 20);
    ConfigError::Syntax { file: file.to_string(), line: 1, message }
}

/// A TOML syntax error; when it lies in a value (an integer too large for
/// TOML's i64, a bad date …), the error names that value's field: the
/// document is parsed again with the value blanked out to find its path.
fn syntax_error(file: &str, text: &str, e: &toml::de::Error) -> ConfigError {
    let message = one_line(e.message());
    let start = e.span().map_or(0, |s| s.start).min(text.len());
    let line = line_of(text, start);
    // The parser points at the value's first character: take the whole bare value (number, date, word).
    let len = text.as_bytes()[start..].iter().take_while(|b| b.is_ascii_alphanumeric() || b"+-_.:".contains(b)).count();
    let span = start..start + len;
    if len > 0 {
        let blanked = format!("{}0{}{}", &text[..span.start], " ".repeat(span.len() - 1), &text[span.end..]);
        if let Some(field) = Doc::parse(&blanked).ok().and_then(|d| d.path_at(span.start).map(str::to_string)) {
            return ConfigError::Field { file: file.to_string(), line, field, message };
        }
    }
    ConfigError::Syntax { file: file.to_string(), line, message }
}

/// A parser message on one line (`expected …` parts joined with `; `).
fn one_line(message: &str) -> String {
    message.trim().lines().map(str::trim).collect::<Vec<_>>().join("; ")
}

/// 1-based line of a byte offset.
fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())].iter().filter(|&&b| b == b'\n').count() + 1
}

/// The span of every key and value of a TOML document, by field path.
struct Doc {
    entries: Vec<Entry>,
}

/// One field: its path, the span of its key (absent for array elements) and of its value.
struct Entry {
    path: String,
    key: Option<Range<usize>>,
    value: Range<usize>,
}

impl Doc {
    fn parse(text: &str) -> Result<Doc, toml::de::Error> {
        let root: Node = toml::from_str(text)?;
        let mut entries = Vec::new();
        root.flatten("", &mut entries);
        Ok(Doc { entries })
    }

    /// The path of the innermost key or value containing `offset` (the deepest among equal spans,
    /// as an array of tables and its element share one).
    fn path_at(&self, offset: usize) -> Option<&str> {
        let contains = |r: &Range<usize>| r.start <= offset && (offset < r.end || r.is_empty() && offset == r.start);
        self.entries
            .iter()
            .rev()
            .flat_map(|e| e.key.iter().chain(std::iter::once(&e.value)).filter(|r| contains(r)).map(move |r| (r.len(), e)))
            .min_by_key(|(len, _)| *len)
            .map(|(_, e)| e.path.as_str())
    }

    /// Line of the field at `path`, or of its nearest enclosing field present in the file.
    fn line_of_path(&self, text: &str, path: &str) -> usize {
        let mut p = path;
        loop {
            if let Some(e) = self.entries.iter().find(|e| e.path == p) {
                return line_of(text, e.key.as_ref().unwrap_or(&e.value).start);
            }
            match p.rfind(['.', '[']) {
                Some(i) => p = &p[..i],
                None => return 1,
            }
        }
    }

    fn field_error(&self, file: &str, text: &str, e: Invalid) -> ConfigError {
        ConfigError::Field { file: file.to_string(), line: self.line_of_path(text, &e.field), field: e.field, message: e.message }
    }

    fn serde_error(&self, file: &str, text: &str, e: &toml::de::Error) -> ConfigError {
        let message = one_line(e.message());
        let offset = e.span().map_or(0, |s| s.start);
        let here = self.path_at(offset).unwrap_or("").to_string();
        // "missing field `x`" points at the enclosing table: name the field itself.
        let (field, message) = match message.strip_prefix("missing field `").and_then(|m| m.strip_suffix('`')) {
            Some(name) => (join(&here, name), "required field is missing".to_string()),
            None => (here, message),
        };
        if field.is_empty() {
            ConfigError::Syntax { file: file.to_string(), line: line_of(text, offset), message }
        } else {
            ConfigError::Field { file: file.to_string(), line: line_of(text, offset), field, message }
        }
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// A TOML value with the spans of its keys and elements.
enum Node {
    Table(Vec<(Spanned<String>, Spanned<Node>)>),
    Array(Vec<Spanned<Node>>),
    Scalar,
}

impl Node {
    fn flatten(&self, path: &str, out: &mut Vec<Entry>) {
        match self {
            Node::Table(items) => {
                for (k, v) in items {
                    let p = join(path, k.get_ref());
                    out.push(Entry { path: p.clone(), key: Some(k.span()), value: v.span() });
                    v.get_ref().flatten(&p, out);
                }
            }
            Node::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    let p = format!("{path}[{i}]");
                    out.push(Entry { path: p.clone(), key: None, value: v.span() });
                    v.get_ref().flatten(&p, out);
                }
            }
            Node::Scalar => {}
        }
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Node, D::Error> {
        d.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a TOML value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_str<E>(self, _: &str) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(v) = seq.next_element()? {
            items.push(v);
        }
        Ok(Node::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(k) = map.next_key()? {
            items.push((k, map.next_value()?));
        }
        Ok(Node::Table(items))
    }
}
