//! Packed layouts ([`rlmesh_model::layout`]) against the plain forward of each
//! sequence alone: sequences end to end, and a group's shared prompt laid out
//! once with its continuations, give every token the hidden state it gets in
//! a row of its own, and the same parameter gradients.
mod common;

use common::*;
use rlmesh_model::layout::Layout;
use rlmesh_model::{Batch, Transformer};
use tch::{Device, Kind, Tensor};

fn ids(seq: &[u32]) -> Tensor {
    Tensor::from_slice(&seq.iter().map(|&x| x as i64).collect::<Vec<_>>()).view([1, seq.len() as i64])
}

/// Hidden states `[n, H]` of one sequence in a row of its own.
fn alone(model: &Transformer, seq: &[u32]) -> Tensor {
    model.hidden_states(&Batch::right_padded(&ids(seq)), None).unwrap().squeeze_dim(0)
}

/// Hidden states of sequence `span` of a packed forward, gathered token by token.
fn gathered(layout: &Layout, hidden: &Tensor, span: usize) -> Tensor {
    let index: Vec<i64> = (0..layout.sequence_len(span)).map(|j| layout.token_index(span, j) as i64).collect();
    hidden.index_select(0, &Tensor::from_slice(&index))
}

/// Three groups (prompts of 6, 11 and 1 tokens; suffixes of 1 to 9) and two sequences alone.
fn mixed_layout() -> (Layout, Vec<(usize, Vec<u32>)>) {
    let prompts = sequences(&[6, 11, 1], 49152, 3);
    let suffixes = sequences(&[4, 9, 1, 7, 2, 3, 5], 49152, 4);
    let singles = sequences(&[13, 2], 49152, 5);
    let mut layout = Layout::default();
    let mut seqs = vec![];
    let mut next = suffixes.iter();
    for (prompt, members) in prompts.iter().zip([3usize, 2, 2]) {
        let root = layout.push_root(prompt);
        for _ in 0..members {
            let suffix = next.next().unwrap();
            let span = layout.push_child(root, suffix);
            seqs.push((span, [prompt.as_slice(), suffix].concat()));
        }
        if members == 2 {
            let single = &singles[seqs.len() % 2];
            seqs.push((layout.push_root(single), single.clone()));
        }
    }
    (layout, seqs)
}

#[test]
fn packed_layouts_compute_each_sequence_as_it_is_alone() {
    let dir = tempfile::tempdir().unwrap();
    // GQA with biases (Qwen2) and plain multi-head attention (Llama).
    for m in [tiny_model(dir.path(), "qwen2", true, true, 13, &[]), tiny_model(dir.path(), "llama", false, false, 14, &["--heads", "4", "--kv-heads", "4"])] {
        let model = Transformer::load(&m, Device::Cpu, None).unwrap();
        let (layout, seqs) = mixed_layout();
        let hidden = model.packed_hidden_states(&layout.to_device(Device::Cpu)).unwrap();
        assert_eq!(hidden.size()[0] as usize, layout.len());
        let computed: usize = seqs.iter().map(|(_, s)| s.len()).sum();
        assert!(layout.len() < computed, "the prompts are laid out once: {} < {computed}", layout.len());
        let mut worst = 0.0f64;
        for (span, seq) in &seqs {
            worst = worst.max((gathered(&layout, &hidden, *span) - alone(&model, seq)).abs().max().double_value(&[]));
        }
        assert!(worst < 1e-5, "{}: a packed sequence differs from itself alone by {worst}", m.display());

        // Roots only (no shared prompt): each sequence alone, end to end.
        let mut plain = Layout::default();
        let spans: Vec<usize> = seqs.iter().map(|(_, s)| plain.push_root(s)).collect();
        let hidden = model.packed_hidden_states(&plain.to_device(Device::Cpu)).unwrap();
        for (span, (_, seq)) in spans.iter().zip(&seqs) {
            let d = (gathered(&plain, &hidden, *span) - alone(&model, seq)).abs().max().double_value(&[]);
            assert!(d < 1e-5, "roots only: {d}");
        }
    }
}

#[test]
fn a_child_never_sees_its_siblings() {
    // Without the children's mask a later sibling would attend to an earlier one: check the
    // test can tell, by feeding the concatenation as one plain sequence.
    let dir = tempfile::tempdir().unwrap();
    let model = Transformer::load(&tiny_model(dir.path(), "qwen2", true, true, 15, &[]), Device::Cpu, None).unwrap();
    let s = sequences(&[5, 4, 6], 49152, 9);
    let mut layout = Layout::default();
    let root = layout.push_root(&s[0]);
    layout.push_child(root, &s[1]);
    let second = layout.push_child(root, &s[2]);
    let hidden = model.packed_hidden_states(&layout.to_device(Device::Cpu)).unwrap();
    let want = alone(&model, &[s[0].as_slice(), &s[2]].concat());
    assert!((gathered(&layout, &hidden, second) - &want).abs().max().double_value(&[]) < 1e-5);
    let leaky = alone(&model, &[s[0].as_slice(), &s[1], &s[2]].concat()).narrow(0, 9, 6);
    assert!((leaky - want.narrow(0, 5, 6)).abs().max().double_value(&[]) > 1e-3, "the sibling changes the result when seen");
}

#[test]
fn the_shared_prompts_gradient_is_the_sum_over_its_continuations() {
    let dir = tempfile::tempdir().unwrap();
    let model = Transformer::load(&tiny_model(dir.path(), "qwen2", true, true, 16, &[]), Device::Cpu, None).unwrap();
    let (layout, seqs) = mixed_layout();
    let width = model.config.hidden_size;
    tch::manual_seed(5);
    // A loss reading every token of every sequence (the prompt's tokens once per sequence).
    let weights: Vec<Tensor> = seqs.iter().map(|(_, s)| Tensor::randn([s.len() as i64, width], (Kind::Float, Device::Cpu))).collect();
    let grads = |f: &dyn Fn() -> Tensor| {
        for (_, mut v) in model.vs.variables() {
            v.zero_grad();
        }
        f().backward();
        let mut g: Vec<(String, Tensor)> = model.vs.variables().into_iter().map(|(n, v)| (n, v.grad().copy())).collect();
        g.sort_by(|a, b| a.0.cmp(&b.0));
        g
    };
    let packed = grads(&|| {
        let hidden = model.packed_hidden_states(&layout.to_device(Device::Cpu)).unwrap();
        seqs.iter().zip(&weights).map(|((span, _), w)| (gathered(&layout, &hidden, *span) * w).sum(Kind::Float)).fold(Tensor::from(0.0f32), |a, b| a + b)
    });
    let separate = grads(&|| seqs.iter().zip(&weights).map(|((_, s), w)| (alone(&model, s) * w).sum(Kind::Float)).fold(Tensor::from(0.0f32), |a, b| a + b));
    let mut worst = 0.0f64;
    for ((n, a), (_, b)) in packed.iter().zip(&separate) {
        let scale = b.abs().max().double_value(&[]).max(1e-6);
        let rel = (a - b).abs().max().double_value(&[]) / scale;
        assert!(rel < 1e-4, "{n}: relative gradient difference {rel}");
        worst = worst.max(rel);
    }
    eprintln!("largest relative gradient difference: {worst:e}");
}
