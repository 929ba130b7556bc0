//! Tool schemas match what transformers' `get_json_schema` produces for the
//! equivalent Python functions, key order included.
use rlmesh_core::tools::{calculator, inventory::Inventory, Environment, ToolSpec};
use serde_json::Value;
use std::collections::BTreeMap;
use std::process::Command;

rlmesh_core::tool_enum! {
    /// Temperature units.
    pub enum Unit {
        /// Celsius.
        Celsius = "celsius",
        /// Fahrenheit.
        Fahrenheit = "fahrenheit",
    }
}

rlmesh_core::tool_args! {
    /// Every supported argument shape.
    pub struct Everything {
        /// A name.
        pub name: String,
        /// How many,
        /// spread over two lines.
        pub count: i64,
        /// A ratio.
        pub ratio: f64,
        /// A flag.
        pub flag: bool,
        /// Some tags.
        pub tags: Vec<String>,
        /// A matrix of integers.
        pub matrix: Vec<Vec<i64>>,
        /// Scores by name.
        pub scores: BTreeMap<String, f64>,
        /// Anything at all.
        pub extra: Value,
        /// The unit.
        pub unit: Option<Unit>,
        /// An optional limit.
        pub limit: Option<i64>,
        /// Optional list of names.
        pub names: Option<Vec<String>>,
    }
}

const PYTHON: &str = r#"
import json
from typing import Any, Literal, Optional
from transformers.utils import get_json_schema

def calculator(operation: Literal["add", "subtract", "multiply", "divide", "power"], a: float, b: float):
    """Perform one arithmetic operation on two numbers.

    Args:
        operation: The operation to perform.
        a: The first operand.
        b: The second operand.
    """

def list_items():
    """List the names of the items in the inventory."""

def get_stock(item: str):
    """Get the current stock (quantity) of one item.

    Args:
        item: The item name, e.g. "apples".
    """

def set_stock(item: str, quantity: int):
    """Set the stock (quantity) of one item.

    Args:
        item: The item name, e.g. "apples".
        quantity: The new quantity (zero or more).
    """

def everything(name: str, count: int, ratio: float, flag: bool, tags: list[str], matrix: list[list[int]],
               scores: dict[str, float], extra: Any, unit: Optional[Literal["celsius", "fahrenheit"]] = None,
               limit: Optional[int] = None, names: Optional[list[str]] = None):
    """Takes every supported argument shape.

    Args:
        name: A name.
        count: How many,
            spread over two lines.
        ratio: A ratio.
        flag: A flag.
        tags: Some tags.
        matrix: A matrix of integers.
        scores: Scores by name.
        extra: Anything at all.
        unit: The unit.
        limit: An optional limit.
        names: Optional list of names.
    """

for f in [calculator, list_items, get_stock, set_stock, everything]:
    print(json.dumps(get_json_schema(f), separators=(",", ":")))
"#;

fn rust_schemas() -> Vec<Value> {
    let mut specs = vec![calculator::tool().spec.json_schema()];
    specs.extend(Inventory::methods().iter().map(|m| m.spec.json_schema()));
    specs.push(ToolSpec::new::<Everything>("everything", "Takes every supported argument shape.").json_schema());
    specs
}

#[test]
fn schemas_equal_transformers_get_json_schema_byte_for_byte() {
    let py = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/py");
    let out = Command::new(py).arg("-c").arg(PYTHON).output().expect("run scripts/py (the project's Python venv)");
    assert!(out.status.success(), "python failed: {}", String::from_utf8_lossy(&out.stderr));
    let python: Vec<String> = String::from_utf8(out.stdout).unwrap().lines().map(str::to_string).collect();
    let rust: Vec<String> = rust_schemas().iter().map(|v| serde_json::to_string(v).unwrap()).collect();
    assert_eq!(rust.len(), python.len());
    for (r, p) in rust.iter().zip(&python) {
        assert_eq!(r, p);
    }
}

#[test]
fn calculator_schema_is_pinned() {
    let expected = r#"{"type":"function","function":{"name":"calculator","description":"Perform one arithmetic operation on two numbers.","parameters":{"type":"object","properties":{"operation":{"type":"string","enum":["add","subtract","multiply","divide","power"],"description":"The operation to perform."},"a":{"type":"number","description":"The first operand."},"b":{"type":"number","description":"The second operand."}},"required":["operation","a","b"]}}}"#;
    assert_eq!(serde_json::to_string(&calculator::tool().spec.json_schema()).unwrap(), expected);
}

#[test]
fn a_tool_without_arguments_has_empty_properties_and_no_required() {
    let list = &Inventory::methods()[0];
    assert_eq!(serde_json::to_string(&list.spec.parameters).unwrap(), r#"{"type":"object","properties":{}}"#);
}
