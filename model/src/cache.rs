//! A preallocated key/value cache: one `[B, kv_heads, capacity, head_dim]`
//! buffer per layer, filled in place (no concatenation per step).
use tch::{Device, Kind, Tensor};

/// Keys and values of every layer for a batch of sequences.
pub struct KvCache {
    keys: Vec<Tensor>,
    values: Vec<Tensor>,
    len: usize,
    capacity: usize,
}

impl KvCache {
    /// Allocate a cache of `capacity` slots for `batch` sequences.
    pub fn new(layers: usize, batch: i64, kv_heads: i64, capacity: usize, head_dim: i64, kind: Kind, device: Device) -> Self {
        let shape = [batch, kv_heads, capacity as i64, head_dim];
        KvCache {
            keys: (0..layers).map(|_| Tensor::zeros(shape, (kind, device))).collect(),
            values: (0..layers).map(|_| Tensor::zeros(shape, (kind, device))).collect(),
            len: 0,
            capacity,
        }
    }

    /// Slots filled so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no slot is filled.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Layers held.
    pub fn layers(&self) -> usize {
        self.keys.len()
    }

    /// Sequences (rows) held.
    pub fn batch(&self) -> usize {
        self.keys.first().map_or(0, |k| k.size()[0] as usize)
    }

    /// Total slots.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Write `k`, `v` (`[B, kv, t, hd]`) at slot `start` of `layer` and return the filled prefix views.
    pub(crate) fn append(&mut self, layer: usize, start: usize, k: &Tensor, v: &Tensor) -> (Tensor, Tensor) {
        let t = k.size()[2];
        let (start, end) = (start as i64, start as i64 + t);
        self.keys[layer].narrow(2, start, t).copy_(k);
        self.values[layer].narrow(2, start, t).copy_(v);
        (self.keys[layer].narrow(2, 0, end), self.values[layer].narrow(2, 0, end))
    }

    /// Layer `layer`'s key and value buffers (`[B, kv, capacity, head_dim]`).
    pub(crate) fn layer(&self, layer: usize) -> (&Tensor, &Tensor) {
        (&self.keys[layer], &self.values[layer])
    }

    /// Mark `t` more slots as filled (after every layer appended).
    pub(crate) fn advance(&mut self, t: i64) {
        self.len += t as usize;
    }

    /// Reorder / repeat rows: row i of the result is row `index[i]` of this cache
    /// (shares a prompt's prefill across the G samples of a group).
    pub fn select_rows(&self, index: &Tensor) -> KvCache {
        KvCache {
            keys: self.keys.iter().map(|k| k.index_select(0, index)).collect(),
            values: self.values.iter().map(|v| v.index_select(0, index)).collect(),
            len: self.len,
            capacity: self.capacity,
        }
    }

    /// Row `row`'s slots `[start, start + len)` of every layer, copied out of
    /// this cache (`[1, kv_heads, len, head_dim]` per layer): keys, then values.
    pub(crate) fn copy_row(&self, row: i64, start: usize, len: usize) -> (Vec<Tensor>, Vec<Tensor>) {
        let out = |t: &Tensor| t.narrow(0, row, 1).narrow(2, start as i64, len as i64).copy();
        (self.keys.iter().map(out).collect(), self.values.iter().map(out).collect())
    }

    /// Writes per-layer keys and values (`[1, kv_heads, len, head_dim]`, their
    /// first `len` slots) into row `row` from slot `at`.
    pub(crate) fn write_row(&mut self, row: i64, at: usize, len: usize, keys: &[Tensor], values: &[Tensor]) {
        for (dst, src) in self.keys.iter_mut().zip(keys).chain(self.values.iter_mut().zip(values)) {
            dst.narrow(0, row, 1).narrow(2, at as i64, len as i64).copy_(&src.narrow(2, 0, len as i64));
        }
    }

    /// Marks the first `len` slots of every row as filled (after [`KvCache::write_row`]).
    pub(crate) fn set_len(&mut self, len: usize) {
        assert!(len <= self.capacity, "{len} slots filled of {}", self.capacity);
        self.len = len;
    }
}
