//! Tool parameter schemas derived from typed Rust argument structs, in exactly
//! the shape transformers' `get_json_schema` produces, and a validator for the
//! subset of JSON schema those shapes use.
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

/// Checks `value` against a schema of the shapes above (`type`, `nullable`,
/// `enum`, `items`, `properties`/`required`, `additionalProperties`; other
/// keywords are ignored). Arguments not in `properties` are rejected. The
/// error names the argument path, what was expected and what was found.
pub fn validate(schema: &Value, value: &Value) -> Result<(), String> {
    check(schema, value, "")
}

fn check(schema: &Value, value: &Value, path: &str) -> Result<(), String> {
    let Some(s) = schema.as_object() else { return Ok(()) };
    let at = |p: &str| if p.is_empty() { "arguments".to_string() } else { format!("argument \"{p}\"") };
    if value.is_null() && s.get("nullable") == Some(&Value::Bool(true)) {
        return Ok(());
    }
    if let Some(t) = s.get("type") {
        let types: Vec<&str> = match t {
            Value::String(t) => vec![t.as_str()],
            Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
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
    match value {
        Value::Array(items) => {
            if let Some(item_schema) = s.get("items") {
                for (i, item) in items.iter().enumerate() {
                    check(item_schema, item, &format!("{path}[{i}]"))?;
                }
            }
        }
        Value::Object(fields) => {
            let join = |k: &str| if path.is_empty() { k.to_string() } else { format!("{path}.{k}") };
            if let Some(Value::Array(required)) = s.get("required") {
                for r in required.iter().filter_map(Value::as_str) {
                    if !fields.contains_key(r) {
                        return Err(format!("missing required argument \"{}\"", join(r)));
                    }
                }
            }
            let properties = s.get("properties").and_then(Value::as_object);
            let additional = s.get("additionalProperties");
            for (k, v) in fields {
                match (properties.and_then(|p| p.get(k)), additional) {
                    (Some(ps), _) | (None, Some(ps)) => check(ps, v, &join(k))?,
                    (None, None) if properties.is_some() => {
                        let known: Vec<&str> = properties.into_iter().flat_map(|p| p.keys()).map(String::as_str).collect();
                        return Err(format!("unexpected argument \"{}\" (expected: {})", join(k), known.join(", ")));
                    }
                    (None, None) => {}
                }
            }
        }
        _ => {}
    }
    Ok(())
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
