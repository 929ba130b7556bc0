//! The calculator of the seed: one tool, five operations on two numbers.
//!
//! Integer inputs stay exact (64-bit, falling back to floating point on
//! overflow); integer results print without `.0` (`17 * 24` → `"408"`);
//! division by zero and non-finite results are tool errors.
//!
//! ```
//! use rlmesh_core::tools::calculator::{calculate, Operation};
//! assert_eq!(calculate(Operation::Multiply, &17.into(), &24.into()).unwrap(), "408");
//! ```
use super::tool::{Tool, ToolError};
use serde_json::Number;

/// The calculator's tool name.
pub const NAME: &str = "calculator";

crate::tool_enum! {
    /// An arithmetic operation.
    pub enum Operation {
        /// `a + b`.
        Add = "add",
        /// `a - b`.
        Subtract = "subtract",
        /// `a * b`.
        Multiply = "multiply",
        /// `a / b`.
        Divide = "divide",
        /// `a` to the power `b`.
        Power = "power",
    }
}

impl Operation {
    /// The infix symbol used in prompts (`+ - * / ^`).
    pub fn symbol(self) -> &'static str {
        match self {
            Operation::Add => "+",
            Operation::Subtract => "-",
            Operation::Multiply => "*",
            Operation::Divide => "/",
            Operation::Power => "^",
        }
    }
}

crate::tool_args! {
    /// Arguments of the calculator.
    pub struct CalculatorArgs {
        /// The operation to perform.
        pub operation: Operation,
        /// The first operand.
        pub a: Number,
        /// The second operand.
        pub b: Number,
    }
}

/// The calculator tool (`calculator`).
pub fn tool() -> Tool {
    Tool::new(NAME, "Perform one arithmetic operation on two numbers.", |args: CalculatorArgs| {
        calculate(args.operation, &args.a, &args.b)
    })
}

/// Computes `a <op> b` and formats the result as the tool returns it.
pub fn calculate(op: Operation, a: &Number, b: &Number) -> Result<String, ToolError> {
    if let (Some(x), Some(y)) = (a.as_i64(), b.as_i64()) {
        let exact = match op {
            Operation::Add => x.checked_add(y),
            Operation::Subtract => x.checked_sub(y),
            Operation::Multiply => x.checked_mul(y),
            Operation::Divide if y != 0 && x % y == 0 => x.checked_div(y),
            Operation::Power => u32::try_from(y).ok().and_then(|e| x.checked_pow(e)),
            Operation::Divide => None,
        };
        if let Some(v) = exact {
            return Ok(v.to_string());
        }
    }
    let (x, y) = (as_f64(a)?, as_f64(b)?);
    let v = match op {
        Operation::Add => x + y,
        Operation::Subtract => x - y,
        Operation::Multiply => x * y,
        Operation::Divide if y == 0.0 => return Err(ToolError::new("division by zero")),
        Operation::Divide => x / y,
        Operation::Power if x == 0.0 && y < 0.0 => {
            return Err(ToolError::new("zero cannot be raised to a negative power"))
        }
        Operation::Power => x.powf(y),
    };
    format_number(v)
}

fn as_f64(n: &Number) -> Result<f64, ToolError> {
    n.as_f64().ok_or_else(|| ToolError::new(format!("{n} is not a representable number")))
}

/// Significant digits of a non-integer result, as a pocket calculator shows
/// (`0.1 + 0.2` is `0.3`, not `0.30000000000000004`).
pub const SIGNIFICANT_DIGITS: usize = 10;

/// Formats a result: integers without a decimal point, other values rounded
/// to [`SIGNIFICANT_DIGITS`] and written in the shortest form that reads back
/// as that rounded value; NaN and infinities are errors.
pub fn format_number(v: f64) -> Result<String, ToolError> {
    if !v.is_finite() {
        return Err(ToolError::new("the result is not a finite number"));
    }
    let v: f64 = format!("{v:.*e}", SIGNIFICANT_DIGITS - 1).parse().unwrap_or(v);
    if v == 0.0 {
        return Ok("0".into());
    }
    if v.fract() == 0.0 && v.abs() < 1e16 {
        return Ok(format!("{v:.0}"));
    }
    Ok(v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn calc(op: &str, a: serde_json::Value, b: serde_json::Value) -> Result<String, String> {
        tool().call(&json!({"operation": op, "a": a, "b": b})).map_err(|e| e.to_string())
    }

    #[test]
    fn integer_results_have_no_decimal_point() {
        assert_eq!(calc("multiply", json!(17), json!(24)), Ok("408".into()));
        assert_eq!(calc("add", json!(2.5), json!(0.5)), Ok("3".into()));
        assert_eq!(calc("divide", json!(84), json!(4)), Ok("21".into()));
        assert_eq!(calc("power", json!(2), json!(10)), Ok("1024".into()));
        assert_eq!(calc("subtract", json!(3), json!(10)), Ok("-7".into()));
        assert_eq!(calc("multiply", json!(-0.0), json!(5)), Ok("0".into()));
    }

    #[test]
    fn decimals_round_to_ten_significant_digits() {
        assert_eq!(calc("divide", json!(7), json!(2)), Ok("3.5".into()));
        assert_eq!(calc("add", json!(0.1), json!(0.2)), Ok("0.3".into()));
        assert_eq!(calc("subtract", json!(409.8), json!(415)), Ok("-5.2".into()));
        assert_eq!(calc("divide", json!(1), json!(3)), Ok("0.3333333333".into()));
        assert_eq!(calc("divide", json!(2), json!(3)), Ok("0.6666666667".into()));
        assert_eq!(calc("divide", json!(1), json!(30000)), Ok("0.00003333333333".into()));
        assert_eq!(calc("power", json!(4), json!(0.5)), Ok("2".into()));
        assert_eq!(calc("power", json!(2), json!(-2)), Ok("0.25".into()));
    }

    #[test]
    fn integers_stay_exact_and_overflow_falls_back_to_floats() {
        assert_eq!(calc("add", json!(9007199254740993i64), json!(0)), Ok("9007199254740993".into()));
        assert_eq!(calc("multiply", json!(i64::MAX), json!(2)), Ok("18446744070000000000".into()));
    }

    #[test]
    fn impossible_results_are_tool_errors() {
        assert_eq!(calc("divide", json!(5), json!(0)), Err("division by zero".into()));
        assert_eq!(calc("divide", json!(5.5), json!(0.0)), Err("division by zero".into()));
        assert_eq!(calc("power", json!(0), json!(-1)), Err("zero cannot be raised to a negative power".into()));
        assert_eq!(calc("power", json!(10), json!(400)), Err("the result is not a finite number".into()));
        assert_eq!(calc("power", json!(-8), json!(0.5)), Err("the result is not a finite number".into()));
    }

    #[test]
    fn bad_arguments_are_argument_errors() {
        let e = calc("modulo", json!(1), json!(2)).unwrap_err();
        assert!(e.starts_with("invalid arguments for \"calculator\": unknown variant `modulo`"), "{e}");
        let e = tool().call(&json!({"operation": "add", "a": 1})).unwrap_err().to_string();
        assert!(e.contains("missing field `b`"), "{e}");
    }
}
