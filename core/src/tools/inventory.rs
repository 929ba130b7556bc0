//! A stateful example environment: a store's inventory the agent must query
//! and update in several steps.
//!
//! The task's `env_state` is `{"stock": {"apples": 12, …}, "goal": {"apples": 20}}`
//! (`goal` optional). `reset` names the items (not their quantities, so the
//! agent has to look them up); `get_reward` is the fraction of goal items whose
//! final stock equals the goal.
use super::environment::{Environment, Method};
use super::tool::ToolError;
use crate::task::Task;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// The environment's name in configs and in `Task::environment`.
pub const NAME: &str = "inventory";

/// Stock per item, and the stock the task wants at the end.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Inventory {
    /// Current quantity per item.
    pub stock: BTreeMap<String, i64>,
    /// Quantities the task expects at the end (empty: no grade).
    pub goal: BTreeMap<String, i64>,
}

crate::tool_args! {
    /// Arguments of `list_items` (none).
    pub struct ListArgs {}
}

crate::tool_args! {
    /// Arguments of `get_stock`.
    pub struct ItemArgs {
        /// The item name, e.g. "apples".
        pub item: String,
    }
}

crate::tool_args! {
    /// Arguments of `set_stock`.
    pub struct SetArgs {
        /// The item name, e.g. "apples".
        pub item: String,
        /// The new quantity (zero or more).
        pub quantity: i64,
    }
}

impl Inventory {
    /// The `env_state` JSON of a stock and a goal (the inverse of [`Inventory::from_state`]).
    pub fn state(stock: &[(&str, i64)], goal: &[(&str, i64)]) -> Value {
        let map = |kv: &[(&str, i64)]| kv.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>();
        json!({ "stock": map(stock), "goal": map(goal) })
    }

    /// Reads `env_state`; the error names the field and what was expected.
    pub fn from_state(state: Option<&Value>) -> Result<Inventory, String> {
        let Some(state) = state else { return Ok(Inventory::default()) };
        let obj = state.as_object().ok_or("env_state: expected an object with \"stock\" and \"goal\"")?;
        if let Some(k) = obj.keys().find(|k| *k != "stock" && *k != "goal") {
            return Err(format!("env_state: unknown field \"{k}\" (expected: stock, goal)"));
        }
        let quantities = |field: &str| -> Result<BTreeMap<String, i64>, String> {
            let Some(v) = obj.get(field) else { return Ok(BTreeMap::new()) };
            let m = v.as_object().ok_or(format!("env_state.{field}: expected an object of item quantities"))?;
            m.iter()
                .map(|(k, q)| match q.as_i64() {
                    Some(q) if q >= 0 => Ok((k.clone(), q)),
                    _ => Err(format!("env_state.{field}.{k}: expected a non-negative integer, got {q}")),
                })
                .collect()
        };
        Ok(Inventory { stock: quantities("stock")?, goal: quantities("goal")? })
    }

    fn item_names(&self) -> String {
        self.stock.keys().cloned().collect::<Vec<_>>().join(", ")
    }

    fn list_items(&mut self, _: ListArgs) -> Result<String, ToolError> {
        Ok(if self.stock.is_empty() { "The inventory is empty.".into() } else { self.item_names() })
    }

    fn get_stock(&mut self, a: ItemArgs) -> Result<String, ToolError> {
        match self.stock.get(&a.item) {
            Some(q) => Ok(q.to_string()),
            None => Err(ToolError::new(format!("unknown item \"{}\" (items: {})", a.item, self.item_names()))),
        }
    }

    fn set_stock(&mut self, a: SetArgs) -> Result<String, ToolError> {
        if a.quantity < 0 {
            return Err(ToolError::new(format!("quantity must be zero or more, got {}", a.quantity)));
        }
        self.stock.insert(a.item.clone(), a.quantity);
        Ok(format!("{}: {}", a.item, a.quantity))
    }
}

impl Environment for Inventory {
    fn methods() -> Vec<Method<Self>> {
        vec![
            Method::new("list_items", "List the names of the items in the inventory.", Inventory::list_items),
            Method::new("get_stock", "Get the current stock (quantity) of one item.", Inventory::get_stock),
            Method::new("set_stock", "Set the stock (quantity) of one item.", Inventory::set_stock),
        ]
    }

    fn check_task(task: &Task) -> Result<(), String> {
        Inventory::from_state(task.env_state.as_ref()).map(|_| ())
    }

    fn reset(&mut self, task: &Task) -> Option<String> {
        // Tasks are checked with `check_task` when loaded; an unreadable state starts empty.
        *self = Inventory::from_state(task.env_state.as_ref()).unwrap_or_default();
        Some(if self.stock.is_empty() {
            "The inventory is empty.".into()
        } else {
            format!("The inventory tracks these items: {}.", self.item_names())
        })
    }

    fn get_reward(&self) -> Option<f64> {
        if self.goal.is_empty() {
            return None;
        }
        let met = self.goal.iter().filter(|(k, q)| self.stock.get(*k) == Some(q)).count();
        Some(met as f64 / self.goal.len() as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trips_and_bad_state_names_the_field() {
        let s = Inventory::state(&[("apples", 12)], &[("apples", 20)]);
        let inv = Inventory::from_state(Some(&s)).unwrap();
        assert_eq!(inv.stock["apples"], 12);
        assert_eq!(inv.goal["apples"], 20);
        let bad = json!({"stock": {"apples": -1}});
        assert_eq!(
            Inventory::from_state(Some(&bad)),
            Err("env_state.stock.apples: expected a non-negative integer, got -1".into())
        );
        assert_eq!(
            Inventory::from_state(Some(&json!({"stok": {}}))),
            Err("env_state: unknown field \"stok\" (expected: stock, goal)".into())
        );
    }

    #[test]
    fn reward_is_the_fraction_of_goal_items_met() {
        let mut inv = Inventory::from_state(Some(&Inventory::state(&[("a", 1), ("b", 2)], &[("a", 5), ("b", 2)]))).unwrap();
        assert_eq!(inv.get_reward(), Some(0.5));
        inv.set_stock(SetArgs { item: "a".into(), quantity: 5 }).unwrap();
        assert_eq!(inv.get_reward(), Some(1.0));
        assert_eq!(Inventory::default().get_reward(), None);
    }
}
