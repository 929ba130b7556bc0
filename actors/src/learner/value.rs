//! The value head (StepTool's critic): `Linear(H → 1)` on the policy's final
//! hidden states, in its own float32 `VarStore` under TRL's names
//! (`v_head.summary.weight`, `v_head.summary.bias`), zero-initialised.
use tch::{nn, Device, Kind, Tensor};

/// A linear value head over the final hidden states.
pub struct ValueHead {
    /// Its parameters (float32).
    pub vs: nn::VarStore,
    weight: Tensor,
    bias: Tensor,
}

impl ValueHead {
    /// A zero-initialised head for hidden size `hidden` on `device`.
    pub fn new(hidden: i64, device: Device) -> ValueHead {
        let vs = nn::VarStore::new(device);
        let p = vs.root() / "v_head" / "summary";
        let weight = p.var("weight", &[1, hidden], nn::Init::Const(0.0));
        let bias = p.var("bias", &[1], nn::Init::Const(0.0));
        ValueHead { vs, weight, bias }
    }

    /// Values `[B, T]` from hidden states `[B, T, H]` (computed in float32).
    pub fn forward(&self, hidden: &Tensor) -> Tensor {
        hidden.to_kind(Kind::Float).linear(&self.weight, Some(&self.bias)).squeeze_dim(-1)
    }

    /// The parameters by name, sorted.
    pub fn named(&self) -> Vec<(String, Tensor)> {
        let mut v: Vec<(String, Tensor)> = self.vs.variables().into_iter().collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}
