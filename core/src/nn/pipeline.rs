//! Pipeline parallelism as mlx-lm's `PipelineMixin` does it: each rank holds a contiguous range
//! of decoder layers, the hidden state travels between neighbours with `send` / `recv`, and an
//! `all_gather` at the end gives every rank the last stage's output.
//!
//! The split runs in reverse: rank `N-1` holds the first layers and rank 0 the last, each
//! getting `L / N` layers and the low ranks one more while `L % N` lasts. Every rank keeps the
//! embedding, the final norm and the head. A step: rank `r < N-1` receives the hidden state
//! from rank `r+1`, runs its layers, and (for `r > 0`) sends it on to rank `r-1`; then
//! `all_gather(h)[..B]` (rank 0's rows) feeds the norm and head on every rank.

use std::ops::Range;

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;

use crate::distributed::Group;
use crate::{Error, Result};

/// The `model_type`s mlx-lm pipelines that Weft splits too: `qwen2` and `ministral3` over the
/// dense stack ([`super::DenseDecoder`]), `qwen3_moe` over its own, and the hybrid stack's
/// families ([`super::HybridDecoder`]).
pub const PIPELINED_TYPES: [&str; 6] = ["qwen2", "ministral3", "qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_moe"];

/// mlx-lm `PipelineMixin.pipeline` with the even split: the layers `rank` runs.
pub fn stage_layers(num_layers: usize, rank: usize, size: usize) -> Range<usize> {
    let (base, extra) = (num_layers / size, num_layers % size);
    let split = |r: usize| base + usize::from(r < extra);
    let start: usize = (rank + 1..size).map(split).sum();
    start..start + split(rank)
}

/// One rank's stage of a pipelined model.
pub(crate) struct Stage {
    pub group: Group,
    pub layers: Range<usize>,
}

impl Stage {
    pub(crate) fn new(group: Group, model_type: &str, num_layers: usize) -> Result<Stage> {
        if !PIPELINED_TYPES.contains(&model_type) {
            return Err(Error::Unsupported(format!(
                "pipeline parallel for {model_type:?} (supported: {})",
                PIPELINED_TYPES.join(", ")
            )));
        }
        if num_layers < group.size() {
            return Err(Error::Unsupported(format!(
                "pipeline parallel: {num_layers} layers cannot be split over {} ranks",
                group.size()
            )));
        }
        let layers = stage_layers(num_layers, group.rank(), group.size());
        Ok(Stage { group, layers })
    }

    /// The hidden state this stage starts from: received from the previous stage, or `h`
    /// (the embedding) on the first.
    pub(crate) fn receive(&self, h: Array) -> Result<Array> {
        let (rank, size) = (self.group.rank(), self.group.size());
        if rank < size - 1 {
            // A receive has no inputs, so MLX may run it before the previous step's
            // `all_gather` when steps are queued ahead (greedy decoding builds step n+1 before
            // reading token n), and it would read that gather's bytes. Evaluating this step's
            // input first finishes every earlier collective.
            h.eval()?;
            self.group.recv_like(&h, rank + 1)
        } else {
            Ok(h)
        }
    }

    /// Hands this stage's output on and returns the last stage's output, on every rank.
    pub(crate) fn hand_on(&self, h: Array) -> Result<Array> {
        let (rank, size) = (self.group.rank(), self.group.size());
        let h = if rank != 0 {
            let sent = self.group.send(&h, rank - 1)?;
            // mlx-lm ties the send to the cache (`mx.depends`) so that a prefill chunk, whose
            // output nobody evaluates, still sends; here it is sent now.
            sent.eval()?;
            sent
        } else {
            h
        };
        if size == 1 {
            return Ok(h);
        }
        let b = h.dim(0);
        Ok(self.group.all_gather(&h)?.index(..b))
    }
}
