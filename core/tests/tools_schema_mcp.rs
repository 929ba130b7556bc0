//! The argument check on the schemas MCP servers publish: copied verbatim from
//! `tools/list` of a pydantic server (the `mcp` package's MCPServer, mcp 2.3.0,
//! pydantic 2.14) and of `@modelcontextprotocol/server-everything` (zod 4).
use rlmesh_core::tools::schema::{check_schema, validate};
use serde_json::{json, Value};

/// `def greet(name: str, title: Optional[str] = None, punctuation: Literal["!", "."] = "!")`
fn greet() -> Value {
    json!({"properties": {"name": {"title": "Name", "type": "string"}, "title": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": null, "title": "Title"}, "punctuation": {"default": "!", "enum": ["!", "."], "title": "Punctuation", "type": "string"}}, "required": ["name"], "type": "object", "title": "greetArguments"})
}

/// `def total(items: list[Item], discount: float | None = None)` with
/// `class Item(BaseModel): name: str; price: float = Field(description=…); quantity: int = 1`.
fn total() -> Value {
    json!({"properties": {"items": {"items": {"$ref": "#/$defs/Item"}, "title": "Items", "type": "array"}, "discount": {"anyOf": [{"type": "number"}, {"type": "null"}], "default": null, "title": "Discount"}}, "required": ["items"], "type": "object", "$defs": {"Item": {"properties": {"name": {"title": "Name", "type": "string"}, "price": {"description": "Unit price", "title": "Price", "type": "number"}, "quantity": {"default": 1, "title": "Quantity", "type": "integer"}}, "required": ["name", "price"], "title": "Item", "type": "object"}}, "title": "totalArguments"})
}

/// `def area(shape: Circle | Square = Field(discriminator="kind"))`.
fn area() -> Value {
    json!({"properties": {"shape": {"discriminator": {"mapping": {"circle": "#/$defs/Circle", "square": "#/$defs/Square"}, "propertyName": "kind"}, "oneOf": [{"$ref": "#/$defs/Circle"}, {"$ref": "#/$defs/Square"}], "title": "Shape"}}, "required": ["shape"], "type": "object", "$defs": {"Circle": {"properties": {"kind": {"const": "circle", "default": "circle", "title": "Kind", "type": "string"}, "radius": {"title": "Radius", "type": "number"}}, "required": ["radius"], "title": "Circle", "type": "object"}, "Square": {"properties": {"kind": {"const": "square", "default": "square", "title": "Kind", "type": "string"}, "side": {"title": "Side", "type": "number"}}, "required": ["side"], "title": "Square", "type": "object"}}, "title": "areaArguments"})
}

/// server-everything's `get-resource-links` and `gzip-file-as-resource`.
fn resource_links() -> Value {
    json!({"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "properties": {"count": {"default": 3, "description": "Number of resource links to return (1-10)", "type": "number", "minimum": 1, "maximum": 10}}})
}

fn gzip() -> Value {
    json!({"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "properties": {"name": {"default": "README.md.gz", "type": "string", "description": "Name of the output file"}, "data": {"default": "https://raw.githubusercontent.com/modelcontextprotocol/servers/refs/heads/main/README.md", "type": "string", "format": "uri", "description": "URL or data URI of the file content to compress"}, "outputType": {"default": "resourceLink", "description": "How the resulting gzipped file should be returned.", "type": "string", "enum": ["resourceLink", "resource"]}}})
}

fn err(schema: &Value, value: Value) -> String {
    validate(schema, &value).expect_err(&value.to_string())
}

#[test]
fn published_schemas_are_usable() {
    for s in [greet(), total(), area(), resource_links(), gzip()] {
        assert_eq!(check_schema(&s), Ok(()), "{s}");
    }
}

#[test]
fn optional_and_defaulted_arguments_may_be_left_out_or_null() {
    let g = greet();
    for ok in [json!({"name": "Ada"}), json!({"name": "Ada", "title": null}), json!({"name": "Ada", "title": "Dr", "punctuation": "."})] {
        assert_eq!(validate(&g, &ok), Ok(()), "{ok}");
    }
    assert_eq!(validate(&resource_links(), &json!({})), Ok(()));
    assert_eq!(validate(&gzip(), &json!({"outputType": "resource"})), Ok(()));
    // A property with a default may be left out even where a schema lists it as required.
    let listed = json!({"type": "object", "properties": {"n": {"type": "integer", "default": 1}}, "required": ["n"]});
    assert_eq!(validate(&listed, &json!({})), Ok(()));
}

#[test]
fn any_of_errors_say_what_each_branch_expects() {
    let g = greet();
    assert_eq!(err(&g, json!({"name": "Ada", "title": 3})), "argument \"title\": expected string or null, got an integer (3)");
    assert_eq!(err(&g, json!({"name": "Ada", "punctuation": "?"})), "argument \"punctuation\": expected one of [\"!\", \".\"], got a string (\"?\")");
    assert_eq!(err(&g, json!({"title": "Dr"})), "missing required argument \"name\"");
    assert_eq!(err(&total(), json!({"items": [], "discount": "10%"})), "argument \"discount\": expected number or null, got a string (\"10%\")");
}

#[test]
fn refs_to_defs_check_nested_models() {
    let t = total();
    assert_eq!(validate(&t, &json!({"items": [{"name": "pen", "price": 1.5}, {"name": "ink", "price": 3, "quantity": 2}]})), Ok(()));
    assert_eq!(err(&t, json!({"items": [{"name": "pen"}]})), "missing required argument \"items[0].price\"");
    assert_eq!(err(&t, json!({"items": [{"name": "pen", "price": 1, "quantity": 1.5}]})), "argument \"items[0].quantity\": expected integer, got a decimal number (1.5)");
    assert_eq!(err(&t, json!({"items": [{"name": "pen", "price": 1, "colour": "red"}]})), "unexpected argument \"items[0].colour\" (expected: name, price, quantity)");
    assert_eq!(err(&t, json!({"items": {"name": "pen"}})), "argument \"items\": expected array, got an object");
    // The same with draft-04 `definitions`.
    let old = json!({"type": "object", "properties": {"p": {"$ref": "#/definitions/P"}}, "definitions": {"P": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}});
    assert_eq!(check_schema(&old), Ok(()));
    assert_eq!(err(&old, json!({"p": {}})), "missing required argument \"p.x\"");
}

#[test]
fn one_of_picks_the_member_a_discriminator_names() {
    let a = area();
    assert_eq!(validate(&a, &json!({"shape": {"kind": "circle", "radius": 2}})), Ok(()));
    assert_eq!(validate(&a, &json!({"shape": {"side": 2}})), Ok(()), "the discriminator has a default");
    assert_eq!(err(&a, json!({"shape": {"kind": "square", "radius": 2}})), "missing required argument \"shape.side\"");
    assert_eq!(err(&a, json!({"shape": {"kind": "triangle"}})), "argument \"shape\": expected \"Circle\" or \"Square\", got an object");
    assert_eq!(err(&a, json!({"shape": "circle"})), "argument \"shape\": expected \"Circle\" or \"Square\", got a string (\"circle\")");
    // Fields of both members: neither accepts it (unknown arguments are refused).
    assert_eq!(err(&a, json!({"shape": {"radius": 1, "side": 1}})), "argument \"shape\": expected \"Circle\" or \"Square\", got an object");
    // oneOf wants exactly one member to accept.
    let both = json!({"type": "object", "properties": {"n": {"oneOf": [{"type": "number"}, {"type": "integer"}]}}});
    assert_eq!(err(&both, json!({"n": 2})), "argument \"n\": matches more than one of number or integer, got an integer (2)");
    assert_eq!(validate(&both, &json!({"n": 2.5})), Ok(()));
}

#[test]
fn bounds_and_closed_objects_are_checked() {
    let r = resource_links();
    assert_eq!(err(&r, json!({"count": 0})), "argument \"count\": expected at least 1, got an integer (0)");
    assert_eq!(err(&r, json!({"count": 10.5})), "argument \"count\": expected at most 10, got a decimal number (10.5)");
    let closed = json!({"type": "object", "additionalProperties": false});
    assert_eq!(err(&closed, json!({"x": 1})), "unexpected argument \"x\" (expected: )");
    let open = json!({"type": "object", "properties": {"a": {"type": "string", "minLength": 2}}, "additionalProperties": true});
    assert_eq!(validate(&open, &json!({"a": "ab", "b": 1})), Ok(()));
    assert_eq!(err(&open, json!({"a": "é"})), "argument \"a\": expected at least 2 characters, got 1");
    let list = json!({"type": "object", "properties": {"xs": {"type": "array", "items": {"type": ["integer", "null"]}, "maxItems": 2}}});
    assert_eq!(validate(&list, &json!({"xs": [1, null]})), Ok(()));
    assert_eq!(err(&list, json!({"xs": [1, 2, 3]})), "argument \"xs\": expected at most 2 items, got 3");
    let all = json!({"type": "object", "properties": {"a": {"allOf": [{"$ref": "#/$defs/N"}], "description": "n"}}, "$defs": {"N": {"type": "integer"}}});
    assert_eq!(err(&all, json!({"a": "x"})), "argument \"a\": expected integer, got a string (\"x\")");
}

#[test]
fn bad_schemas_are_refused_naming_the_keyword() {
    let cases = [
        (json!({"properties": {}}), "type: missing (a tool's parameters are an object schema)"),
        (json!({"type": "array"}), "type: expected \"object\", got \"array\""),
        (json!({"type": "object", "properties": {"a": {"type": "strnig"}}}), "properties.a.type: unknown type \"strnig\" (JSON types: string, integer, number, boolean, array, object, null)"),
        (json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/Missing"}}}), "properties.a.$ref: \"#/$defs/Missing\" does not resolve inside the schema"),
        (json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}, "$defs": {"A": {"$ref": "#/$defs/A"}}}), "properties.a.$ref: the $ref chain from \"#/$defs/A\" loops"),
        (json!({"type": "object", "properties": {"a": {"anyOf": []}}}), "properties.a.anyOf: expected a non-empty list of schemas, got an array"),
        (json!({"type": "object", "properties": []}), "properties: expected an object of schemas, got an array"),
        (json!({"type": "object", "required": "a"}), "required: expected a list of property names, got a string (\"a\")"),
        (json!({"type": "object", "properties": {"a": 3}}), "properties.a: expected a schema (an object), got an integer (3)"),
    ];
    for (schema, want) in cases {
        assert_eq!(check_schema(&schema), Err(want.to_string()), "{schema}");
    }
}

#[test]
fn a_recursive_model_checks_to_any_depth_of_the_value() {
    // pydantic's self-referencing model: `class Node(BaseModel): value: int; children: list["Node"] = []`.
    let s = json!({"type": "object", "properties": {"tree": {"$ref": "#/$defs/Node"}}, "required": ["tree"], "$defs": {"Node": {"type": "object", "properties": {"value": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}, "default": []}}, "required": ["value"]}}});
    assert_eq!(check_schema(&s), Ok(()));
    let mut tree = json!({"value": 0});
    for i in 1..100 {
        tree = json!({"value": i, "children": [tree]});
    }
    assert_eq!(validate(&s, &json!({"tree": tree})), Ok(()));
    assert_eq!(err(&s, json!({"tree": {"value": 1, "children": [{"value": "x"}]}})), "argument \"tree.children[0].value\": expected integer, got a string (\"x\")");
}
