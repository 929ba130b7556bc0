//! Tools: schemas, the calculator, stateful environments, execution, and the `<tool_call>` parser.
