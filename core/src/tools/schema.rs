//! Tool parameter schemas derived from typed Rust argument structs, in exactly
//! the shape transformers' `get_json_schema` produces, and a validator for
//! those shapes and for the ones tool servers publish (pydantic's `anyOf`,
//! `oneOf`, `$ref` to `$defs`, defaults; see [`validate`] and [`check_schema`]).
//!
//! A type describes itself with [`SchemaType`] (the Rust analogue of
//! `_parse_type_hint`); a struct of arguments made with [`tool_args!`] gets
//! [`ToolArgs::parameters`] (the `"parameters"` object) from one definition:
//!
//! ```
//! use rlmesh_core::tools::ToolArgs;
//! rlmesh_core::tool_args! {
//!     /// Arguments of `get_weather`.
//!     pub struct WeatherArgs {
//!         /// The city to look up.
//!         pub city: String,
//!         /// Days ahead (0 = today).
//!         pub days: Option<i64>,
//!     }
//! }
//! let p = WeatherArgs::parameters();
//! assert_eq!(p["required"], serde_json::json!(["city"]));
//! assert_eq!(p["properties"]["days"]["nullable"], true);
//! ```
//!
//! | Rust type | Python hint | schema |
//! |---|---|---|
//! | `String` | `str` | `{"type": "string"}` |
//! | `i64`, `i32`, `u32`, `u64`, `usize` | `int` | `{"type": "integer"}` |
//! | `f64`, `f32`, `serde_json::Number` | `float` | `{"type": "number"}` |
//! | `bool` | `bool` | `{"type": "boolean"}` |
//! | `Vec<T>` | `list[T]` | `{"type": "array", "items": T}` |
//! | `BTreeMap<String, T>`, `HashMap<String, T>` | `dict[str, T]` | `{"type": "object", "additionalProperties": T}` |
//! | `serde_json::Value` | `Any` | `{}` |
//! | `Option<T>` (not required) | `T \| None = None` | `T` plus `"nullable": true` |
//! | an enum made with [`tool_enum!`] | `Literal["a", "b"]` | `{"type": "string", "enum": ["a", "b"]}` |
//! | a struct made with [`tool_args!`] | (none) | `{"type": "object", "properties": …, "required": …}` |
//!
//! [`tool_args!`]: crate::tool_args
//! [`tool_enum!`]: crate::tool_enum
use serde::de::DeserializeOwned;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashMap};

/// A Rust type that can appear as a tool argument, with its JSON schema.
pub trait SchemaType {
    /// True for `Option<T>`: the argument may be left out (it is not `required`).
    const OPTIONAL: bool = false;
    /// The JSON schema of one value of this type (without `description`).
    fn schema() -> Value;
}

/// The typed arguments of one tool: deserialisable from the call's JSON object.
pub trait ToolArgs: DeserializeOwned {
    /// The `"parameters"` object: `{"type": "object", "properties": {…}, "required": […]}`.
    fn parameters() -> Value;
}

macro_rules! scalar_schema {
    ($json:literal: $($t:ty),+) => {
        $(impl SchemaType for $t {
            fn schema() -> Value {
                json!({ "type": $json })
            }
        })+
    };
}
scalar_schema!("string": String);
scalar_schema!("integer": i64, i32, u32, u64, usize);
scalar_schema!("number": f64, f32, serde_json::Number);
scalar_schema!("boolean": bool);

impl SchemaType for Value {
    fn schema() -> Value {
        json!({})
    }
}

impl<T: SchemaType> SchemaType for Option<T> {
    const OPTIONAL: bool = true;
    fn schema() -> Value {
        let mut s = T::schema();
        if let Value::Object(m) = &mut s {
            m.insert("nullable".into(), Value::Bool(true));
        }
        s
    }
}

impl<T: SchemaType> SchemaType for Vec<T> {
    fn schema() -> Value {
        json!({ "type": "array", "items": T::schema() })
    }
}

impl<T: SchemaType> SchemaType for BTreeMap<String, T> {
    fn schema() -> Value {
        json!({ "type": "object", "additionalProperties": T::schema() })
    }
}

impl<T: SchemaType> SchemaType for HashMap<String, T> {
    fn schema() -> Value {
        json!({ "type": "object", "additionalProperties": T::schema() })
    }
}

/// One field of an argument struct, as [`tool_args!`](crate::tool_args) lists it.
#[derive(Debug)]
pub struct Field {
    /// Argument name.
    pub name: &'static str,
    /// Schema of its type.
    pub schema: Value,
    /// True when the argument may be left out.
    pub optional: bool,
    /// Its doc-comment lines (joined into the `description`).
    pub doc: &'static [&'static str],
}

/// The `{"type": "object", "properties", "required"}` schema of a list of
/// fields; `required` is left out when empty, as transformers does.
pub fn object_schema(fields: Vec<Field>) -> Value {
    let mut properties = Map::new();
    let mut required = Vec::new();
    for f in fields {
        let mut s = f.schema;
        if let Value::Object(m) = &mut s {
            m.insert("description".into(), Value::String(description(f.doc)));
        }
        properties.insert(f.name.to_string(), s);
        if !f.optional {
            required.push(Value::String(f.name.to_string()));
        }
    }
    let mut out = Map::new();
    out.insert("type".into(), "object".into());
    out.insert("properties".into(), Value::Object(properties));
    if !required.is_empty() {
        out.insert("required".into(), Value::Array(required));
    }
    Value::Object(out)
}

/// Doc lines joined the way transformers joins a docstring's argument
/// description: trimmed, line breaks collapsed to one space.
fn description(lines: &[&str]) -> String {
    lines.iter().map(|l| l.trim()).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" ")
}

/// Defines an argument struct and its [`ToolArgs`] schema from one definition.
///
/// Every field needs a doc comment (it becomes the argument's `description`,
/// as the docstring's `Args:` entry does in Python); `Option<T>` fields are
/// optional and nullable, all others are required. Unknown arguments are
/// rejected on deserialisation. The struct also implements [`SchemaType`], so
/// it can nest inside another argument struct (as an object or in a `Vec`).
/// The calling crate needs `serde` (with `derive`) and `serde_json`.
#[macro_export]
macro_rules! tool_args {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $(
                $(#[doc = $doc:literal])+
                $fvis:vis $field:ident : $ty:ty
            ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq, ::serde::Deserialize, ::serde::Serialize)]
        #[serde(deny_unknown_fields)]
        $vis struct $name {
            $( $(#[doc = $doc])+ $fvis $field: $ty, )*
        }
        impl $crate::tools::ToolArgs for $name {
            fn parameters() -> ::serde_json::Value {
                $crate::tools::schema::object_schema(vec![
                    $( $crate::tools::schema::Field {
                        name: stringify!($field),
                        schema: <$ty as $crate::tools::SchemaType>::schema(),
                        optional: <$ty as $crate::tools::SchemaType>::OPTIONAL,
                        doc: &[$($doc),+],
                    }, )*
                ])
            }
        }
        impl $crate::tools::SchemaType for $name {
            fn schema() -> ::serde_json::Value {
                <$name as $crate::tools::ToolArgs>::parameters()
            }
        }
    };
}

/// Defines a string enum for tool arguments (Python's `Literal["a", "b"]`):
/// `{"type": "string", "enum": [...]}`, each variant named by its JSON string.
#[macro_export]
macro_rules! tool_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[doc = $doc:literal])* $variant:ident = $value:literal ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, ::serde::Deserialize, ::serde::Serialize)]
        $vis enum $name {
            $( $(#[doc = $doc])* #[serde(rename = $value)] $variant, )+
        }
        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
            /// The JSON string of this value.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $value),+ }
            }
        }
        impl $crate::tools::SchemaType for $name {
            fn schema() -> ::serde_json::Value {
                ::serde_json::json!({ "type": "string", "enum": [$($value),+] })
            }
        }
    };
}

/// Checks `value` against a tool's parameter schema. Besides the shapes
/// above it reads what MCP servers emit (pydantic's and zod's schemas):
/// `anyOf`, `oneOf`, `allOf`, `$ref` to `#/$defs/…` or `#/definitions/…`,
/// `const`, `type` lists with `"null"`, `default` (a property with one may be
/// left out even when listed as required), `additionalProperties` (a schema
/// or a boolean), and the bounds `minimum`, `maximum`, `exclusiveMinimum`,
/// `exclusiveMaximum`, `minLength`, `maxLength`, `minItems`, `maxItems`.
/// Other keywords (`format`, `pattern`, `title`, …) are ignored. Arguments
/// not in `properties` are rejected unless `additionalProperties` allows them.
/// The error names the argument path, what was expected and what was found.
pub fn validate(schema: &Value, value: &Value) -> Result<(), String> {
    Validator { root: schema }.check(schema, value, "", 0)
}

/// Checks that a tool's parameter schema can be used: an object schema whose
/// keywords have the right shapes, whose `type`s are JSON types and whose
/// `$ref`s resolve inside it. The error names the keyword's path.
pub fn check_schema(schema: &Value) -> Result<(), String> {
    match schema.get("type") {
        Some(Value::String(t)) if t == "object" => {}
        Some(t) => return Err(format!("type: expected \"object\", got {t}")),
        None => return Err("type: missing (a tool's parameters are an object schema)".into()),
    }
    check_node(schema, schema, "")
}

/// `$ref` hops followed without reaching a value's child: past this a `$ref` chain loops.
const MAX_REF_HOPS: usize = 32;

const JSON_TYPES: &[&str] = &["string", "integer", "number", "boolean", "array", "object", "null"];

fn at(path: &str) -> String {
    if path.is_empty() {
        "arguments".to_string()
    } else {
        format!("argument \"{path}\"")
    }
}

/// The schema a local `$ref` (`#`, `#/$defs/Name`, any `#/…` JSON pointer) points to.
fn resolve<'a>(root: &'a Value, reference: &str) -> Option<&'a Value> {
    reference.strip_prefix('#').and_then(|pointer| root.pointer(pointer))
}

struct Validator<'a> {
    root: &'a Value,
}

impl<'a> Validator<'a> {
    /// `schema` with its `$ref`s followed (at most [`MAX_REF_HOPS`]); `None` when one does not resolve.
    fn target(&self, mut schema: &'a Value) -> Option<&'a Value> {
        for _ in 0..MAX_REF_HOPS {
            match schema.get("$ref").and_then(Value::as_str) {
                Some(r) => schema = resolve(self.root, r)?,
                None => return Some(schema),
            }
        }
        None
    }

    fn check(&self, schema: &'a Value, value: &Value, path: &str, hops: usize) -> Result<(), String> {
        let s = match schema {
            Value::Object(s) => s,
            Value::Bool(false) => return Err(format!("{}: no value is allowed here, got {}", at(path), describe(value))),
            _ => return Ok(()),
        };
        if let Some(Value::String(r)) = s.get("$ref") {
            let target = resolve(self.root, r).ok_or_else(|| format!("{}: the schema's $ref \"{r}\" does not resolve", at(path)))?;
            if hops >= MAX_REF_HOPS {
                return Err(format!("{}: the schema's $ref \"{r}\" loops", at(path)));
            }
            self.check(target, value, path, hops + 1)?;
        }
        if value.is_null() && s.get("nullable") == Some(&Value::Bool(true)) {
            return Ok(());
        }
        if let Some(types) = s.get("type").map(type_names) {
            if !types.is_empty() && !types.iter().any(|t| has_type(value, t)) {
                return Err(format!("{}: expected {}, got {}", at(path), types.join(" or "), describe(value)));
            }
        }
        if let Some(Value::Array(choices)) = s.get("enum") {
            if !choices.contains(value) {
                let list: Vec<String> = choices.iter().map(Value::to_string).collect();
                return Err(format!("{}: expected one of [{}], got {}", at(path), list.join(", "), describe(value)));
            }
        }
        if let Some(c) = s.get("const") {
            if c != value {
                return Err(format!("{}: expected {c}, got {}", at(path), describe(value)));
            }
        }
        check_bounds(s, value).map_err(|e| format!("{}: {e}", at(path)))?;
        if let Some(Value::Array(all)) = s.get("allOf") {
            for branch in all {
                self.check(branch, value, path, hops + 1)?;
            }
        }
        if let Some(Value::Array(any)) = s.get("anyOf") {
            if !any.iter().any(|b| self.check(b, value, path, hops + 1).is_ok()) {
                return Err(self.no_branch(any, value, path, hops));
            }
        }
        if let Some(Value::Array(one)) = s.get("oneOf") {
            match one.iter().filter(|b| self.check(b, value, path, hops + 1).is_ok()).count() {
                1 => {}
                0 => return Err(self.no_branch(one, value, path, hops)),
                _ => {
                    let alts = self.summaries(one);
                    return Err(format!("{}: matches more than one of {alts}, got {}", at(path), describe(value)));
                }
            }
        }
        match value {
            Value::Array(items) => {
                if let Some(item_schema) = s.get("items") {
                    for (i, item) in items.iter().enumerate() {
                        self.check(item_schema, item, &format!("{path}[{i}]"), 0)?;
                    }
                }
            }
            Value::Object(fields) => self.check_fields(s, fields, path)?,
            _ => {}
        }
        Ok(())
    }

    fn check_fields(&self, s: &'a Map<String, Value>, fields: &Map<String, Value>, path: &str) -> Result<(), String> {
        let join = |k: &str| if path.is_empty() { k.to_string() } else { format!("{path}.{k}") };
        let properties = s.get("properties").and_then(Value::as_object);
        if let Some(Value::Array(required)) = s.get("required") {
            for r in required.iter().filter_map(Value::as_str) {
                let has_default = || {
                    let p = properties.and_then(|p| p.get(r));
                    p.and_then(|p| self.target(p)).is_some_and(|p| p.get("default").is_some())
                };
                if !fields.contains_key(r) && !has_default() {
                    return Err(format!("missing required argument \"{}\"", join(r)));
                }
            }
        }
        let additional = s.get("additionalProperties");
        for (k, v) in fields {
            match (properties.and_then(|p| p.get(k)), additional) {
                (Some(ps), _) => self.check(ps, v, &join(k), 0)?,
                (None, Some(Value::Bool(false))) | (None, None) if properties.is_some() || additional.is_some() => {
                    let known: Vec<&str> = properties.into_iter().flat_map(|p| p.keys()).map(String::as_str).collect();
                    return Err(format!("unexpected argument \"{}\" (expected: {})", join(k), known.join(", ")));
                }
                (None, Some(ps)) => self.check(ps, v, &join(k), 0)?,
                (None, None) => {}
            }
        }
        Ok(())
    }

    /// The error when no branch of an `anyOf`/`oneOf` accepts `value`: the
    /// branch's own error when only one branch has the value's shape (its
    /// type, and any `const` field a discriminated union tells its members by),
    /// else what the branches expect.
    fn no_branch(&self, branches: &'a [Value], value: &Value, path: &str, hops: usize) -> String {
        let shaped: Vec<&Value> = branches.iter().filter(|b| self.has_shape(b, value)).collect();
        if let [only] = shaped[..] {
            if let Err(e) = self.check(only, value, path, hops + 1) {
                return e;
            }
        }
        format!("{}: expected {}, got {}", at(path), self.summaries(branches), describe(value))
    }

    fn has_shape(&self, branch: &'a Value, value: &Value) -> bool {
        let Some(b) = self.target(branch) else { return false };
        let types = b.get("type").map(type_names).unwrap_or_default();
        let nullable = value.is_null() && b.get("nullable") == Some(&Value::Bool(true));
        if !types.is_empty() && !types.iter().any(|t| has_type(value, t)) && !nullable {
            return false;
        }
        if b.get("const").is_some_and(|c| c != value) {
            return false;
        }
        let (Some(fields), Some(props)) = (value.as_object(), b.get("properties").and_then(Value::as_object)) else {
            return true;
        };
        props.iter().all(|(k, p)| {
            let c = self.target(p).and_then(|p| p.get("const"));
            match (c, fields.get(k)) {
                (Some(c), Some(v)) => c == v,
                _ => true,
            }
        })
    }

    /// What a list of branches expects, e.g. `string or null`, `"Circle" or "Square"`.
    fn summaries(&self, branches: &'a [Value]) -> String {
        branches.iter().map(|b| self.summary(b)).collect::<Vec<_>>().join(" or ")
    }

    fn summary(&self, branch: &'a Value) -> String {
        if let Some(r) = branch.get("$ref").and_then(Value::as_str) {
            let name = r.rsplit('/').next().unwrap_or(r);
            return format!("\"{name}\"");
        }
        if let Some(c) = branch.get("const") {
            return c.to_string();
        }
        if let Some(Value::Array(e)) = branch.get("enum") {
            return format!("one of [{}]", e.iter().map(Value::to_string).collect::<Vec<_>>().join(", "));
        }
        if let Some(Value::Array(inner)) = branch.get("anyOf").or_else(|| branch.get("oneOf")) {
            return self.summaries(inner);
        }
        match branch.get("type").map(type_names) {
            Some(t) if !t.is_empty() => t.join(" or "),
            _ => "any value".to_string(),
        }
    }
}

fn type_names(t: &Value) -> Vec<&str> {
    match t {
        Value::String(t) => vec![t.as_str()],
        Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}

/// The numeric, length and size bounds of one schema node.
fn check_bounds(s: &Map<String, Value>, value: &Value) -> Result<(), String> {
    let bound = |k: &str| s.get(k).and_then(Value::as_f64);
    if let Some(x) = value.as_f64() {
        type Within = fn(f64, f64) -> bool;
        let checks: [(&str, Within, &str); 4] = [
            ("minimum", |x, b| x >= b, "at least"),
            ("maximum", |x, b| x <= b, "at most"),
            ("exclusiveMinimum", |x, b| x > b, "more than"),
            ("exclusiveMaximum", |x, b| x < b, "less than"),
        ];
        for (key, within, words) in checks {
            if bound(key).is_some_and(|b| !within(x, b)) {
                return Err(format!("expected {words} {}, got {}", s[key], describe(value)));
            }
        }
    }
    let size = match value {
        Value::String(t) => Some((t.chars().count(), "minLength", "maxLength", "characters")),
        Value::Array(a) => Some((a.len(), "minItems", "maxItems", "items")),
        _ => None,
    };
    if let Some((n, min, max, unit)) = size {
        if bound(min).is_some_and(|b| (n as f64) < b) {
            return Err(format!("expected at least {} {unit}, got {n}", s[min]));
        }
        if bound(max).is_some_and(|b| (n as f64) > b) {
            return Err(format!("expected at most {} {unit}, got {n}", s[max]));
        }
    }
    Ok(())
}

/// Walks one schema node for [`check_schema`]; `path` names it (`properties.items.type`).
fn check_node(root: &Value, node: &Value, path: &str) -> Result<(), String> {
    let s = match node {
        Value::Object(s) => s,
        Value::Bool(_) => return Ok(()),
        other => return Err(format!("{}: expected a schema (an object), got {}", where_(path), describe(other))),
    };
    let key = |k: &str| if path.is_empty() { k.to_string() } else { format!("{path}.{k}") };
    for (k, v) in s {
        let here = key(k);
        match k.as_str() {
            "type" => {
                let names = type_names(v);
                if names.is_empty() || names.len() != v.as_array().map_or(1, Vec::len) {
                    return Err(format!("{here}: expected a type name or a list of them, got {}", describe(v)));
                }
                if let Some(t) = names.iter().find(|t| !JSON_TYPES.contains(t)) {
                    return Err(format!("{here}: unknown type \"{t}\" (JSON types: {})", JSON_TYPES.join(", ")));
                }
            }
            "$ref" => {
                let r = v.as_str().ok_or_else(|| format!("{here}: expected a string, got {}", describe(v)))?;
                if resolve(root, r).is_none() {
                    return Err(format!("{here}: \"{r}\" does not resolve inside the schema"));
                }
            }
            "properties" | "$defs" | "definitions" => {
                let m = v.as_object().ok_or_else(|| format!("{here}: expected an object of schemas, got {}", describe(v)))?;
                for (name, sub) in m {
                    check_node(root, sub, &format!("{here}.{name}"))?;
                }
            }
            "required" if !v.as_array().is_some_and(|a| a.iter().all(Value::is_string)) => {
                return Err(format!("{here}: expected a list of property names, got {}", describe(v)));
            }
            "enum" if !v.is_array() => return Err(format!("{here}: expected a list of values, got {}", describe(v))),
            "items" | "additionalProperties" | "not" => check_node(root, v, &here)?,
            "anyOf" | "oneOf" | "allOf" => match v.as_array() {
                Some(branches) if !branches.is_empty() => {
                    for (i, b) in branches.iter().enumerate() {
                        check_node(root, b, &format!("{here}[{i}]"))?;
                    }
                }
                _ => return Err(format!("{here}: expected a non-empty list of schemas, got {}", describe(v))),
            },
            _ => {}
        }
    }
    if let Some(r) = s.get("$ref").and_then(Value::as_str) {
        let mut seen = vec![r];
        let mut target = resolve(root, r);
        while let Some(next) = target.and_then(|t| t.get("$ref")).and_then(Value::as_str) {
            if seen.contains(&next) {
                return Err(format!("{}: the $ref chain from \"{r}\" loops", key("$ref")));
            }
            seen.push(next);
            target = resolve(root, next);
        }
    }
    Ok(())
}

fn where_(path: &str) -> &str {
    if path.is_empty() {
        "the schema"
    } else {
        path
    }
}

fn has_type(v: &Value, t: &str) -> bool {
    match t {
        "string" => v.is_string(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        "array" => v.is_array(),
        "object" => v.is_object(),
        "null" => v.is_null(),
        _ => true,
    }
}

/// A short description of a JSON value for error messages (`a string ("x")`).
pub(crate) fn describe(v: &Value) -> String {
    let kind = match v {
        Value::Null => return "null".to_string(),
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_f64() => "a decimal number",
        Value::Number(_) => "an integer",
        Value::String(_) => "a string",
        Value::Array(_) => return "an array".to_string(),
        Value::Object(_) => return "an object".to_string(),
    };
    let mut text = v.to_string();
    if text.len() > 40 {
        let cut = (0..=40).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
        text.truncate(cut);
        text.push('…');
    }
    format!("{kind} ({text})")
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::tool_enum! {
        /// Units.
        enum Unit {
            /// Celsius.
            C = "celsius",
            /// Fahrenheit.
            F = "fahrenheit",
        }
    }

    crate::tool_args! {
        /// A point.
        struct Point {
            /// X.
            x: i64,
            /// Y.
            y: Option<i64>,
        }
    }

    crate::tool_args! {
        /// Test arguments.
        struct Args {
            /// The name,
            /// over two lines.
            name: String,
            /// The unit.
            unit: Option<Unit>,
            /// Points.
            points: Vec<Point>,
            /// Counts.
            counts: BTreeMap<String, i64>,
        }
    }

    #[test]
    fn description_joins_doc_lines_with_one_space() {
        assert_eq!(Args::parameters()["properties"]["name"]["description"], "The name, over two lines.");
    }

    #[test]
    fn option_is_nullable_and_not_required() {
        let p = Args::parameters();
        assert_eq!(p["required"], json!(["name", "points", "counts"]));
        assert_eq!(
            serde_json::to_string(&p["properties"]["unit"]).unwrap(),
            r#"{"type":"string","enum":["celsius","fahrenheit"],"nullable":true,"description":"The unit."}"#
        );
    }

    #[test]
    fn validate_reports_path_expected_and_found() {
        let p = Args::parameters();
        let ok = json!({"name": "a", "points": [{"x": 1}, {"x": 2, "y": null}], "counts": {"k": 3}});
        assert_eq!(validate(&p, &ok), Ok(()));
        let cases = [
            (json!({"points": [], "counts": {}}), "missing required argument \"name\""),
            (json!({"name": 1, "points": [], "counts": {}}), "argument \"name\": expected string, got an integer (1)"),
            (json!({"name": "a", "unit": "kelvin", "points": [], "counts": {}}), "argument \"unit\": expected one of [\"celsius\", \"fahrenheit\"], got a string (\"kelvin\")"),
            (json!({"name": "a", "points": [{"x": 1.5}], "counts": {}}), "argument \"points[0].x\": expected integer, got a decimal number (1.5)"),
            (json!({"name": "a", "points": [{}], "counts": {}}), "missing required argument \"points[0].x\""),
            (json!({"name": "a", "points": [], "counts": {"k": "3"}}), "argument \"counts.k\": expected integer, got a string (\"3\")"),
            (json!({"name": "a", "points": [], "counts": {}, "extra": 1}), "unexpected argument \"extra\" (expected: name, unit, points, counts)"),
            (json!({"name": null, "points": [], "counts": {}}), "argument \"name\": expected string, got null"),
        ];
        for (value, want) in cases {
            assert_eq!(validate(&p, &value), Err(want.to_string()), "{value}");
        }
    }

    #[test]
    fn valid_arguments_deserialise_into_the_struct() {
        let a: Args = serde_json::from_value(json!({"name": "a", "unit": "celsius", "points": [{"x": 1}], "counts": {}})).unwrap();
        assert_eq!(a.unit, Some(Unit::C));
        assert_eq!(a.points[0], Point { x: 1, y: None });
        assert_eq!(Unit::ALL.iter().map(|u| u.as_str()).collect::<Vec<_>>(), ["celsius", "fahrenheit"]);
    }
}
