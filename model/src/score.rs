//! Per-token log-probabilities of given sequences (teacher forcing).
use crate::error::{ModelError, Result};
use crate::transformer::{Batch, Transformer};
use tch::{Kind, Tensor};

/// A right-padded batch of sequences as tensors.
pub struct Padded {
    /// Ids `[B, T]` (padding filled with 0).
    pub ids: Tensor,
    /// Validity `[B, T]` (bool).
    pub valid: Tensor,
    /// Length of each sequence.
    pub lens: Vec<usize>,
}

/// Right-pad sequences into tensors on `device`.
pub fn pad_right(seqs: &[Vec<u32>], device: tch::Device) -> Padded {
    let t = seqs.iter().map(Vec::len).max().unwrap_or(0).max(1);
    let mut ids = vec![0i64; seqs.len() * t];
    let mut valid = vec![false; seqs.len() * t];
    for (i, s) in seqs.iter().enumerate() {
        for (j, &tok) in s.iter().enumerate() {
            ids[i * t + j] = tok as i64;
            valid[i * t + j] = true;
        }
    }
    let b = seqs.len() as i64;
    Padded {
        ids: Tensor::from_slice(&ids).view([b, t as i64]).to_device(device),
        valid: Tensor::from_slice(&valid).view([b, t as i64]).to_device(device),
        lens: seqs.iter().map(Vec::len).collect(),
    }
}

impl Transformer {
    /// log P(ids[:, t+1] | ids[:, ..=t]) as a `[B, T-1]` float32 tensor (differentiable;
    /// positions past a sequence's end hold garbage and must be masked by the caller).
    pub fn token_logprobs(&self, ids: &Tensor, valid: &Tensor) -> Result<Tensor> {
        let batch = Batch::new(ids, valid);
        let logits = self.forward(&batch, None)?;
        let t = logits.size()[1];
        let logp = logits.narrow(1, 0, t - 1).to_kind(Kind::Float).log_softmax(-1, Kind::Float);
        let targets = ids.narrow(1, 1, t - 1).unsqueeze(-1);
        Ok(logp.gather(-1, &targets, false).squeeze_dim(-1))
    }

    /// Per-token log-probs of each sequence (length n−1 each), computed in float32 without gradients.
    pub fn score(&self, seqs: &[Vec<u32>]) -> Result<Vec<Vec<f32>>> {
        for (i, s) in seqs.iter().enumerate() {
            if s.is_empty() {
                return Err(ModelError::Input(format!("sequence {i} is empty")));
            }
            self.check_ids(s)?;
        }
        if seqs.is_empty() {
            return Ok(vec![]);
        }
        let padded = pad_right(seqs, self.device());
        if padded.ids.size()[1] < 2 {
            return Ok(seqs.iter().map(|_| vec![]).collect());
        }
        let lp = tch::no_grad(|| self.token_logprobs(&padded.ids, &padded.valid))?.to_device(tch::Device::Cpu);
        let t = lp.size()[1] as usize;
        let flat: Vec<f32> = Vec::<f32>::try_from(lp.contiguous().view([-1]))?;
        Ok(padded.lens.iter().enumerate().map(|(i, &n)| flat[i * t..i * t + n - 1].to_vec()).collect())
    }
}

/// Log-probs and entropies at the positions a loss reads.
pub struct MaskedLogprobs {
    /// `[B, T-1]` float32: log P(ids[t+1] | ..=t) where `loss_mask[t+1]` is set, 0 elsewhere (differentiable).
    pub logprobs: Tensor,
    /// `[B, T-1]` float32: entropy of the predictive distribution at the same positions, 0 elsewhere.
    pub entropy: Tensor,
}

impl Transformer {
    /// Like [`Transformer::token_logprobs`], but the `[*, V]` projection and softmax run only at
    /// positions whose *target* token has `loss_mask` set — with long shared prompts (tool schemas)
    /// and short completions this is most of the learner's memory and time.
    ///
    /// `loss_mask` is `[B, T]` (the trajectory's mask over `ids`).
    pub fn masked_token_logprobs(&self, ids: &Tensor, valid: &Tensor, loss_mask: &Tensor) -> Result<MaskedLogprobs> {
        let batch = Batch::new(ids, valid);
        let hidden = self.hidden_states(&batch, None)?;
        let (b, t) = ids.size2()?;
        let h = hidden.size()[2];
        let sel = loss_mask.narrow(1, 1, t - 1).to_kind(Kind::Bool).reshape([-1]);
        let index = sel.nonzero().squeeze_dim(1);
        let picked = hidden.narrow(1, 0, t - 1).reshape([-1, h]).index_select(0, &index);
        let logp_all = picked.linear::<Tensor>(self.lm_head(), None).to_kind(Kind::Float).log_softmax(-1, Kind::Float);
        let targets = ids.narrow(1, 1, t - 1).reshape([-1]).index_select(0, &index).unsqueeze(-1);
        let lp = logp_all.gather(-1, &targets, false).squeeze_dim(-1);
        let ent = -(logp_all.exp() * &logp_all).sum_dim_intlist(-1, false, Kind::Float);
        let zeros = Tensor::zeros([b * (t - 1)], (Kind::Float, ids.device()));
        Ok(MaskedLogprobs {
            logprobs: zeros.index_put(&[Some(index.shallow_clone())], &lp, false).view([b, t - 1]),
            entropy: zeros.index_put(&[Some(index)], &ent, false).view([b, t - 1]),
        })
    }
}
