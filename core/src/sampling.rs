//! Turning a logits row into the next token: mlx-lm's logits processors (logit bias,
//! repetition / presence / frequency penalties over the last `penalty_context` tokens) run as MLX
//! ops exactly as mlx-lm applies them; greedy is `argmax(logprobs)` (first index on ties). The
//! stochastic path (temperature, top-p, min-p, top-k) runs on the host over the logprobs row with
//! a per-request RNG, so every request carries its own seed without serializing anything.

use mlx_rs::ops::indexing::{argmax_axis, IndexOp, TryIndexMutOp};
use mlx_rs::Array;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::{Error, Result};

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// Nucleus threshold in (0, 1]; 1 disables.
    pub top_p: f32,
    /// Keep the k most likely tokens; 0 disables.
    pub top_k: u32,
    /// Drop tokens below `min_p × p(top token)`; 0 disables.
    pub min_p: f32,
    /// Sign-aware multiplicative penalty (mlx-lm / CTRL style); `None` disables.
    pub repetition_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    /// How many recent tokens (prompt included) the penalties look at.
    pub penalty_context: usize,
    /// Additive per-token bias.
    pub logit_bias: Vec<(u32, f32)>,
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            repetition_penalty: None,
            presence_penalty: None,
            frequency_penalty: None,
            penalty_context: 20,
            logit_bias: Vec::new(),
            seed: None,
        }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        Self::default()
    }

    /// Rejects values no sampler can honour, naming the field.
    pub fn validate(&self, vocab_size: usize) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidRequest(m));
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return bad(format!("temperature must be a finite number >= 0, got {}", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        if let Some(p) = self.repetition_penalty {
            if !p.is_finite() || p <= 0.0 {
                return bad(format!("repetition_penalty must be > 0, got {p}"));
            }
        }
        for (name, p) in [("presence_penalty", self.presence_penalty), ("frequency_penalty", self.frequency_penalty)] {
            if p.is_some_and(|p| !p.is_finite()) {
                return bad(format!("{name} must be a finite number"));
            }
        }
        for &(id, b) in &self.logit_bias {
            if id as usize >= vocab_size {
                return bad(format!("logit_bias token id {id} is outside the vocabulary (size {vocab_size})"));
            }
            if !b.is_finite() && b != f32::NEG_INFINITY {
                return bad(format!("logit_bias for token {id} must be a number"));
            }
        }
        Ok(())
    }

    fn has_processors(&self) -> bool {
        !self.logit_bias.is_empty()
            || self.repetition_penalty.is_some_and(|p| p != 1.0)
            || self.presence_penalty.is_some_and(|p| p != 0.0)
            || self.frequency_penalty.is_some_and(|p| p != 0.0)
    }

    /// Greedy with nothing touching the logits: the token can be chosen on the device and the
    /// next step built before it is read (pipelined decode).
    pub fn is_plain_greedy(&self) -> bool {
        self.temperature == 0.0 && !self.has_processors()
    }
}

/// One request's sampler.
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
    /// Penalty/bias history, `penalty_context` tokens at most.
    recent: Vec<u32>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        let rng = match params.seed {
            Some(s) => StdRng::seed_from_u64(s),
            None => StdRng::from_os_rng(),
        };
        Sampler { params, rng, recent: Vec::new() }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Records tokens the penalties should see (the prompt, then each generated token).
    pub fn observe(&mut self, tokens: &[u32]) {
        self.recent.extend_from_slice(tokens);
        let keep = self.params.penalty_context.max(1);
        if self.recent.len() > keep {
            self.recent.drain(..self.recent.len() - keep);
        }
    }

    /// mlx-lm's logits processors, in its order: bias, repetition, presence, frequency.
    /// `logits`: `[1, V]`.
    pub fn process_logits(&self, logits: &Array) -> Result<Array> {
        let p = &self.params;
        let mut logits = logits.clone();
        if !p.logit_bias.is_empty() {
            let ids: Vec<i32> = p.logit_bias.iter().map(|(i, _)| *i as i32).collect();
            let vals: Vec<f32> = p.logit_bias.iter().map(|(_, b)| *b).collect();
            let ids = Array::from_slice(&ids, &[ids.len() as i32]);
            let vals = Array::from_slice(&vals, &[vals.len() as i32]).as_dtype(logits.dtype())?;
            let selected = logits.index((.., &ids)).add(&vals)?;
            logits.try_index_mut((.., &ids), &selected)?;
        }
        if self.recent.is_empty() {
            return Ok(logits);
        }
        let ids: Vec<i32> = self.recent.iter().map(|&t| t as i32).collect();
        let ids = Array::from_slice(&ids, &[ids.len() as i32]);
        if let Some(pen) = p.repetition_penalty.filter(|&x| x != 1.0) {
            let sel = logits.index((.., &ids));
            let pen_a = Array::from_f32(pen).as_dtype(sel.dtype())?;
            let sel = mlx_rs::ops::select(
                &sel.lt(Array::from_f32(0.0))?,
                &sel.multiply(&pen_a)?,
                &sel.divide(&pen_a)?,
            )?;
            logits.try_index_mut((.., &ids), &sel)?;
        }
        for pen in [p.presence_penalty, p.frequency_penalty].into_iter().flatten() {
            if pen != 0.0 {
                let sel = logits.index((.., &ids)).subtract(Array::from_f32(pen).as_dtype(logits.dtype())?)?;
                logits.try_index_mut((.., &ids), &sel)?;
            }
        }
        Ok(logits)
    }

    /// `logits - logsumexp(logits)`, as mlx-lm hands to its samplers.
    pub fn logprobs(logits: &Array) -> Result<Array> {
        Ok(logits.subtract(logits.logsumexp_axis(-1, true)?)?)
    }

    /// Device-side greedy choice over `[B, V]` logprobs → `[B]` int32.
    pub fn argmax(logprobs: &Array) -> Result<Array> {
        Ok(argmax_axis(logprobs, -1, None)?)
    }

    /// Chooses a token from one row of log-probabilities on the host.
    pub fn sample_host(&mut self, logprobs: &[f32]) -> u32 {
        let p = &self.params;
        if p.temperature == 0.0 {
            return first_argmax(logprobs);
        }
        let mut keep: Vec<bool> = logprobs.iter().map(|x| *x > f32::NEG_INFINITY).collect();
        let mut order: Vec<usize> = (0..logprobs.len()).collect();
        order.sort_by(|&a, &b| logprobs[a].total_cmp(&logprobs[b]));
        if p.top_p > 0.0 && p.top_p < 1.0 {
            // mlx-lm's apply_top_p: ascending sort; drop the tokens whose probability mass
            // strictly above them (exclusive) already reaches top_p of the total.
            let probs: Vec<f64> = order.iter().map(|&i| (logprobs[i] as f64).exp()).collect();
            let total: f64 = probs.iter().sum();
            let mut above = 0.0f64;
            let mut mass_above = vec![0.0f64; probs.len()];
            for k in (0..probs.len()).rev() {
                mass_above[k] = above;
                above += probs[k];
            }
            let dropped = mass_above.iter().filter(|&&m| m >= p.top_p as f64 * total).count();
            if dropped < order.len() {
                let threshold = logprobs[order[dropped]];
                for (i, &lp) in logprobs.iter().enumerate() {
                    if lp < threshold {
                        keep[i] = false;
                    }
                }
            }
        }
        if p.min_p > 0.0 {
            let top = logprobs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let cut = top + p.min_p.ln();
            for (i, &lp) in logprobs.iter().enumerate() {
                if lp < cut {
                    keep[i] = false;
                }
            }
        }
        if p.top_k > 0 && (p.top_k as usize) < logprobs.len() {
            for &i in order.iter().rev().skip(p.top_k as usize) {
                keep[i] = false;
            }
        }
        let inv_t = 1.0 / p.temperature as f64;
        let max = (0..logprobs.len())
            .filter(|&i| keep[i])
            .map(|i| logprobs[i] as f64 * inv_t)
            .fold(f64::NEG_INFINITY, f64::max);
        if !max.is_finite() {
            return first_argmax(logprobs);
        }
        let weights: Vec<f64> = (0..logprobs.len())
            .map(|i| if keep[i] { (logprobs[i] as f64 * inv_t - max).exp() } else { 0.0 })
            .collect();
        let total: f64 = weights.iter().sum();
        let mut r = self.rng.random::<f64>() * total;
        for (i, w) in weights.iter().enumerate() {
            if *w > 0.0 {
                if r < *w {
                    return i as u32;
                }
                r -= w;
            }
        }
        weights.iter().rposition(|w| *w > 0.0).unwrap_or(0) as u32
    }
}

/// Index of the largest value, the first one on ties (as MLX's argmax).
pub fn first_argmax(xs: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in xs.iter().enumerate() {
        if x > xs[best] {
            best = i;
        }
    }
    best as u32
}
