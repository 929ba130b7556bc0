//! The wire format: serde + bincode 2 with the fixed-int configuration.
//!
//! Every message that crosses a process goes through [`encode`] and [`decode`]
//! so that one place decides the format.
use serde::{de::DeserializeOwned, Serialize};

/// Errors of the wire format.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// Encoding failed.
    #[error("wire encode: {0}")]
    Encode(#[from] bincode::error::EncodeError),
    /// Decoding failed (truncated or foreign bytes).
    #[error("wire decode: {0}")]
    Decode(#[from] bincode::error::DecodeError),
    /// Bytes were left over after the message.
    #[error("wire decode: {0} trailing bytes after the message")]
    Trailing(usize),
}

fn config() -> bincode::config::Configuration<bincode::config::LittleEndian, bincode::config::Fixint> {
    bincode::config::standard().with_fixed_int_encoding()
}

/// Serialise a message to bytes.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, WireError> {
    Ok(bincode::serde::encode_to_vec(value, config())?)
}

/// Deserialise a message from bytes; the whole buffer must be consumed.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, WireError> {
    let (v, n) = bincode::serde::decode_from_slice(bytes, config())?;
    if n != bytes.len() {
        return Err(WireError::Trailing(bytes.len() - n));
    }
    Ok(v)
}

/// Serde adaptor for `serde_json::Value` fields: the value itself in
/// human-readable formats (JSON), its JSON text in binary ones (bincode cannot
/// carry self-describing data).
pub mod json_value {
    use serde::{de::Error, Deserialize, Deserializer, Serialize, Serializer};
    use serde_json::Value;

    /// Serialise.
    pub fn serialize<S: Serializer>(v: &Value, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            v.serialize(s)
        } else {
            serde_json::to_string(v).map_err(serde::ser::Error::custom)?.serialize(s)
        }
    }

    /// Deserialise.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Value, D::Error> {
        if d.is_human_readable() {
            Value::deserialize(d)
        } else {
            let text = String::deserialize(d)?;
            serde_json::from_str(&text).map_err(D::Error::custom)
        }
    }
}

/// [`json_value`] for `Option<Value>` fields.
pub mod json_value_opt {
    use serde::{de::Error, Deserialize, Deserializer, Serialize, Serializer};
    use serde_json::Value;

    /// Serialise.
    pub fn serialize<S: Serializer>(v: &Option<Value>, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            v.serialize(s)
        } else {
            v.as_ref().map(|v| serde_json::to_string(v).map_err(serde::ser::Error::custom)).transpose()?.serialize(s)
        }
    }

    /// Deserialise.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
        if d.is_human_readable() {
            Option::<Value>::deserialize(d)
        } else {
            Option::<String>::deserialize(d)?.map(|t| serde_json::from_str(&t).map_err(D::Error::custom)).transpose()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Group, Message, Span, Step, StopReason, Task, ToolCallMsg, Trajectory};
    use serde_json::json;

    fn sample_group() -> Group {
        let task = Task {
            id: "t1".into(),
            prompt: "Use the calculator to compute 17 * 24.".into(),
            requires_tool: true,
            allowed_tools: vec!["calculator".into()],
            gold_tool_calls: vec![vec![crate::GoldCall { name: "calculator".into(), arguments: json!({"a": 17, "b": 24, "op": "multiply"}) }]],
            expected_answer: Some("408".into()),
            environment: None,
            env_state: Some(json!({"k": [1, 2.5, null]})),
            ..Default::default()
        };
        let mut asst = Message::assistant("");
        asst.tool_calls = Some(vec![ToolCallMsg::new("calculator", json!({"a": 17, "b": 24}))]);
        let traj = Trajectory {
            task_id: "t1".into(),
            sample_index: 0,
            prompt_len: 2,
            rendered_prompt: "<p>".into(),
            token_ids: vec![1, 2, 3, 4],
            loss_mask: vec![0, 0, 1, 1],
            logprobs: vec![0.0, 0.0, -0.5, -1.25],
            versions: vec![0, 0, 7, 7],
            segments: vec![Span { start: 2, end: 4 }],
            summary: None,
            steps: vec![Step {
                turn: 0,
                index: 0,
                name: "calculator".into(),
                arguments: json!({"a": 17}),
                result: "408".into(),
                success: true,
                error: None,
                latency_ms: 0.5,
                repeated: false,
            }],
            format_errors: vec![],
            messages: vec![asst, Message::tool("calculator", "408")],
            completion: "x".into(),
            final_answer: "".into(),
            stop_reason: StopReason::MaxTurns,
            grades: Vec::new(),
        };
        Group { group_id: 3, task, trajectories: vec![traj], failed: None, earlier_segments: vec![] }
    }

    #[test]
    fn group_round_trips_through_bincode_and_json() {
        let g = sample_group();
        let bytes = encode(&g).unwrap();
        let back: Group = decode(&bytes).unwrap();
        assert_eq!(back, g);
        let text = serde_json::to_string(&g).unwrap();
        let back: Group = serde_json::from_str(&text).unwrap();
        assert_eq!(back, g);
        // JSON keeps arguments as objects, not strings.
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["trajectories"][0]["steps"][0]["arguments"]["a"], 17);
    }

    #[test]
    fn truncated_bytes_are_an_error_not_a_panic() {
        let bytes = encode(&sample_group()).unwrap();
        for cut in [0, 1, bytes.len() / 2, bytes.len() - 1] {
            assert!(decode::<Group>(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(matches!(decode::<Group>(&long), Err(WireError::Trailing(1))));
    }
}
