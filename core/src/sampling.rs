//! Turning a logits row into the next token, entirely as MLX ops (so a decode step can be built
//! from the previous step's unread token, see the engine's executor): mlx-lm's logits processors
//! (logit bias, repetition / presence / frequency penalties over the last `penalty_context`
//! tokens) run exactly as mlx-lm applies them; greedy is `argmax(logprobs)` (first index on
//! ties). The stochastic path applies mlx-lm's top-p / min-p / top-k filters with mlx-lm's ops
//! ([`keep_mask`]) and picks by Gumbel-max: `argmax(logprobs / T + g)` over the kept tokens, `g`
//! Gumbel noise from MLX's counter-based generator under a key drawn from the request's own RNG,
//! one key per step. The key does not depend on the token, so it is drawn before the previous
//! token is known, and each request's draws stay its own however the batch is composed.
//!
//! Parity with mlx-lm 0.32 (`mlx_lm/sample_utils.py`) is checked by `tests/sampling.rs` against
//! `goldens/sampling/` (greedy trajectories through the processors; filter kept-sets).

use mlx_rs::ops::indexing::{argmax_axis, IndexOp, TryIndexMutOp, TryIndexUpdateOp, UpdateMode};
use mlx_rs::ops::{concatenate, cumsum, sort_axis};
use mlx_rs::{Array, Dtype};
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
        // Each error names its field (structured, for faces that report it: HTTP's `param`).
        let bad = |key: &str, m: String| Err(Error::field(key, m));
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return bad("temperature", format!("temperature must be a finite number >= 0, got {}", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        if let Some(p) = self.repetition_penalty {
            if !p.is_finite() || p <= 0.0 {
                return bad("repetition_penalty", format!("repetition_penalty must be > 0, got {p}"));
            }
        }
        for (name, p) in [("presence_penalty", self.presence_penalty), ("frequency_penalty", self.frequency_penalty)] {
            if p.is_some_and(|p| !p.is_finite()) {
                return bad(name, format!("{name} must be a finite number"));
            }
        }
        // mlx-lm slices `tokens[-context_size:]`, so 0 would silently mean "the whole history".
        if self.penalty_context == 0 && self.has_penalties() {
            return bad("penalty_context", "penalty_context must be >= 1 when a repetition, presence or frequency penalty is set".into());
        }
        for &(id, b) in &self.logit_bias {
            if id as usize >= vocab_size {
                return bad("logit_bias", format!("logit_bias token id {id} is outside the vocabulary (size {vocab_size})"));
            }
            if !b.is_finite() && b != f32::NEG_INFINITY {
                return bad("logit_bias", format!("logit_bias for token {id} must be a number"));
            }
        }
        Ok(())
    }

    fn has_penalties(&self) -> bool {
        self.repetition_penalty.is_some_and(|p| p != 1.0)
            || self.presence_penalty.is_some_and(|p| p != 0.0)
            || self.frequency_penalty.is_some_and(|p| p != 0.0)
    }

    /// A logit bias or a penalty is set (the logits go through [`Sampler::process_logits`]).
    pub fn has_processors(&self) -> bool {
        !self.logit_bias.is_empty() || self.has_penalties()
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

    /// The request's host RNG (speculative decoding's acceptance draws).
    pub(crate) fn rng(&mut self) -> &mut StdRng {
        &mut self.rng
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
    /// `logits`: `[1, V]`. Same MLX ops as mlx-lm, so the result is bit-identical:
    /// - bias: `logits.at[:, ids].add(values)` (a scatter-add; values cast to the logits dtype;
    ///   a repeated id accumulates),
    /// - repetition: `sel = logits[:, ctx]; logits[:, ctx] = where(sel < 0, sel * p, sel / p)`,
    /// - presence: `logits[:, ctx] -= p` (once per distinct id),
    /// - frequency: `logits.at[:, ctx].subtract(p)` (once per occurrence: a scatter-add),
    ///
    /// where `ctx` is the last `penalty_context` observed tokens (prompt included) and scalars
    /// are cast to the logits dtype first (MLX's weak scalar typing).
    pub fn process_logits(&self, logits: &Array) -> Result<Array> {
        self.process_logits_pending(logits, None)
    }

    /// [`Sampler::process_logits`] when the newest token of the history is still on the device
    /// (`pending`, `[1]`, not yet [`Sampler::observe`]d): the penalty window is the last
    /// `penalty_context - 1` observed tokens and then `pending`, the same ids in the same order
    /// as once it is observed, so the result is bit-identical.
    pub fn process_logits_pending(&self, logits: &Array, pending: Option<&Array>) -> Result<Array> {
        let p = &self.params;
        let mut logits = logits.clone();
        if !p.logit_bias.is_empty() {
            let ids: Vec<i32> = p.logit_bias.iter().map(|(i, _)| *i as i32).collect();
            let vals: Vec<f32> = p.logit_bias.iter().map(|(_, b)| *b).collect();
            let ids = Array::from_slice(&ids, &[ids.len() as i32]);
            let vals = Array::from_slice(&vals, &[vals.len() as i32]).as_dtype(logits.dtype())?;
            logits = scatter_add(&logits, &ids, &vals)?;
        }
        if (self.recent.is_empty() && pending.is_none()) || !p.has_penalties() {
            return Ok(logits);
        }
        let ids = match pending {
            None => {
                let ids: Vec<i32> = self.recent.iter().map(|&t| t as i32).collect();
                Array::from_slice(&ids, &[ids.len() as i32])
            }
            Some(token) => {
                let keep = p.penalty_context.max(1) - 1;
                let host: Vec<i32> = self.recent[self.recent.len().saturating_sub(keep)..].iter().map(|&t| t as i32).collect();
                let host = Array::from_slice(&host, &[host.len() as i32]);
                concatenate(&[host, token.reshape(&[1])?.as_dtype(Dtype::Int32)?], 0)?
            }
        };
        let dtype = logits.dtype();
        let scalar = |x: f32| Array::from_f32(x).as_dtype(dtype);
        if let Some(pen) = p.repetition_penalty.filter(|&x| x != 1.0) {
            let sel = logits.index((.., &ids));
            let pen_a = scalar(pen)?;
            let sel = mlx_rs::ops::select(
                &sel.lt(Array::from_f32(0.0))?,
                &sel.multiply(&pen_a)?,
                &sel.divide(&pen_a)?,
            )?;
            logits.try_index_mut((.., &ids), &sel)?;
        }
        if let Some(pen) = p.presence_penalty.filter(|&x| x != 0.0) {
            let sel = logits.index((.., &ids)).subtract(scalar(pen)?)?;
            logits.try_index_mut((.., &ids), &sel)?;
        }
        if let Some(pen) = p.frequency_penalty.filter(|&x| x != 0.0) {
            // `.at[].subtract(p)` is scatter_add(-p): every occurrence subtracts once more.
            logits = scatter_add(&logits, &ids, &scalar(pen)?.negative()?)?;
        }
        Ok(logits)
    }

    /// `logits - logsumexp(logits)`, as mlx-lm hands to its samplers.
    pub fn logprobs(logits: &Array) -> Result<Array> {
        Ok(logits.subtract(logits.logsumexp_axis(-1, true)?)?)
    }

    /// [`Sampler::logprobs`], through Weft's CPU primitive when `fast` (the model runs fast
    /// mode on the CPU: [`crate::language_model::LanguageModel::fast_cpu_kernels`]).
    pub fn logprobs_with(logits: &Array, fast: bool) -> Result<Array> {
        if fast {
            return crate::kernels::log_softmax(logits);
        }
        Self::logprobs(logits)
    }

    /// Device-side greedy choice over `[B, V]` logprobs → `[B]` int32.
    pub fn argmax(logprobs: &Array) -> Result<Array> {
        Ok(argmax_axis(logprobs, -1, None)?)
    }

    /// The key of this request's next sampled step, from its RNG (one per step, whatever the
    /// token: it can be drawn before the previous token is read).
    fn next_key(&mut self) -> Result<Array> {
        Ok(mlx_rs::random::key(self.rng.random::<u64>())?)
    }

    /// Chooses the next token on the device from `[N, V]` processed log-probabilities → `[N]`
    /// uint32 (one draw per row, all under one key): `argmax` at temperature 0; otherwise
    /// [`draw_rows`]'s draw. One key is drawn per call at temperature > 0.
    pub fn choose(&mut self, logprobs: &Array) -> Result<Array> {
        if self.params.temperature == 0.0 {
            return Self::argmax(logprobs);
        }
        let lp = logprobs.as_dtype(Dtype::Float32)?;
        let noise = gumbel_noise(lp.shape(), &self.next_key()?)?;
        let rows = lp.shape().first().copied().unwrap_or(1).max(1) as usize;
        draw(&lp, &vec![&self.params; rows], &noise)
    }
}

/// Gumbel noise `-log(-log(u))`, `u` uniform in `[f32::MIN_POSITIVE, 1)` under `key` (MLX's
/// counter-based generator), so every value is finite.
fn gumbel_noise(shape: &[i32], key: &Array) -> Result<Array> {
    let u = mlx_rs::random::uniform::<f32, f32>(f32::MIN_POSITIVE, 1.0, shape, key)?;
    Ok(u.log()?.negative()?.log()?.negative()?)
}

/// One draw per row of float32 log-probabilities `[S, V]` (temperature > 0 rows), row `i` with
/// `samplers[i]`'s settings and the next key of its RNG: the same choice [`Sampler::choose`]
/// makes for that row alone with that key (the filters and the noise are row-wise). `[S]` uint32.
pub fn draw_rows(logprobs: &Array, samplers: &mut [&mut Sampler]) -> Result<Array> {
    let width = *logprobs.shape().last().unwrap_or(&0);
    let noise: Vec<Array> = samplers.iter_mut().map(|s| gumbel_noise(&[1, width], &s.next_key()?)).collect::<Result<_>>()?;
    let params: Vec<&SamplingParams> = samplers.iter().map(|s| &s.params).collect();
    draw(logprobs, &params, &concatenate(&noise, 0)?)
}

/// Gumbel-max over the kept tokens: `argmax(where(keep, logprobs * (1 / T) + noise, -inf))`
/// (mlx-lm's `categorical(logprobs * (1 / temp))` restricted to [`keep_mask`]); a kept token
/// always outranks a dropped one. `params` has one entry per row.
fn draw(logprobs: &Array, params: &[&SamplingParams], noise: &Array) -> Result<Array> {
    let keep = keep_mask_rows(logprobs, params)?;
    let inv_t = column(params, |p| (1.0 / p.temperature as f64) as f32);
    let scores = logprobs.multiply(&inv_t)?.add(noise)?;
    let scores = mlx_rs::ops::select(&keep, &scores, Array::from_f32(f32::NEG_INFINITY))?;
    Sampler::argmax(&scores)
}

/// A `[rows, 1]` float32 column of one value per row's settings.
fn column(params: &[&SamplingParams], f: impl Fn(&SamplingParams) -> f32) -> Array {
    let v: Vec<f32> = params.iter().map(|p| f(p)).collect();
    Array::from_slice(&v, &[v.len() as i32, 1])
}

/// mlx-lm's sampling filters as MLX ops over float32 log-probabilities `[N, V]`, in
/// `make_sampler`'s order (`apply_top_p` if `0 < top_p < 1`, `apply_min_p` if `min_p > 0`,
/// top-k if `0 < top_k < V`): `true` where a token survives (never a `-inf` entry). top-p and
/// min-p are mlx-lm's ops (sort, reverse exclusive cumsum of `exp`, `num_dropped`, threshold;
/// `max + f32(ln(min_p))`); top-k keeps the k largest with the lower index winning among equal
/// values at the boundary (mlx-lm's argpartition leaves that open), so `top_k = 1` is greedy.
/// Each filter keeps everything at or above some value, so intersecting them on the original
/// row equals applying them one after another. [`filter_logprobs`] is the host statement of
/// the same rule.
pub fn keep_mask(logprobs: &Array, params: &SamplingParams) -> Result<Array> {
    let rows = logprobs.shape().first().copied().unwrap_or(1).max(1) as usize;
    keep_mask_rows(logprobs, &vec![params; rows])
}

/// [`keep_mask`] with each row's own settings (`params`: one per row). A
/// filter one row does not use keeps all of that row (top-p's threshold and min-p's cut become
/// `-inf`, top-k's k becomes V), so each row's set is what it would be alone.
fn keep_mask_rows(logprobs: &Array, params: &[&SamplingParams]) -> Result<Array> {
    let n = *logprobs.shape().last().unwrap_or(&0);
    let neg_inf = Array::from_f32(f32::NEG_INFINITY);
    let mut keep = logprobs.gt(&neg_inf)?;
    let uses_top_p = |p: &SamplingParams| p.top_p > 0.0 && p.top_p < 1.0;
    let uses_top_k = |p: &SamplingParams| p.top_k > 0 && (p.top_k as i64) < n as i64;
    let top_p = params.iter().any(|p| uses_top_p(p));
    let top_k = params.iter().any(|p| uses_top_k(p));
    let sorted = if top_p || top_k { Some(sort_axis(logprobs, -1)?) } else { None };
    if let (true, Some(sorted)) = (top_p, &sorted) {
        let probs = sorted.exp()?;
        let mass_above = cumsum(&probs, -1, true, false)?;
        let total = mass_above.index((.., ..1)).add(probs.index((.., ..1)))?;
        let target = total.multiply(column(params, |p| p.top_p))?;
        let dropped = mass_above.ge(&target)?.sum_axis(-1, true)?.as_dtype(Dtype::Int32)?;
        // All of a row can count as dropped only when it is all -inf (nothing survives anyway).
        let dropped = mlx_rs::ops::minimum(&dropped, Array::from_int(n - 1))?;
        let threshold = sorted.take_along_axis(&dropped, -1)?;
        let on: Vec<bool> = params.iter().map(|p| uses_top_p(p)).collect();
        let on = Array::from_slice(&on, &[on.len() as i32, 1]);
        let threshold = mlx_rs::ops::select(&on, &threshold, &neg_inf)?;
        keep = keep.logical_and(&logprobs.ge(&threshold)?)?;
    }
    if params.iter().any(|p| p.min_p > 0.0) {
        let top = logprobs.max_axis(-1, true)?;
        // mlx-lm: `top + math.log(min_p)`, the float64 log rounded to float32.
        let cut = top.add(column(params, |p| if p.min_p > 0.0 { (p.min_p as f64).ln() as f32 } else { f32::NEG_INFINITY }))?;
        keep = keep.logical_and(&logprobs.ge(&cut)?)?;
    }
    if let (true, Some(sorted)) = (top_k, &sorted) {
        let ks: Vec<i32> = params.iter().map(|p| if uses_top_k(p) { p.top_k as i32 } else { n }).collect();
        let k = Array::from_slice(&ks, &[ks.len() as i32, 1]);
        let at_index = Array::from_int(n).subtract(&k)?;
        let kth = sorted.take_along_axis(&at_index, -1)?;
        let above = logprobs.gt(&kth)?;
        let at = logprobs.eq(&kth)?;
        let room = k.subtract(above.as_dtype(Dtype::Int32)?.sum_axis(-1, true)?)?;
        // Equal values at the boundary: the first ones in index order fill the room left.
        let rank = cumsum(at.as_dtype(Dtype::Int32)?, -1, false, true)?;
        keep = keep.logical_and(&above.logical_or(&at.logical_and(&rank.le(&room)?)?)?)?;
    }
    Ok(keep)
}

/// `a.at[:, ids].add(updates)` for `a` of shape `[1, V]` (updates broadcast to `[1, len(ids)]`).
fn scatter_add(a: &Array, ids: &Array, updates: &Array) -> Result<Array> {
    a.try_index_update((.., ids), updates, UpdateMode::Add)
        .map_err(|e| Error::Mlx(format!("scatter-add into the logits: {e}")))
}

/// mlx-lm's sampling filters over one row of log-probabilities, in `make_sampler`'s order
/// (`apply_top_p` if `0 < top_p < 1`, `apply_min_p` if `min_p > 0`, `apply_top_k` if
/// `0 < top_k < V`), returning which tokens survive (`true` = kept; `-inf` entries never are).
/// The arithmetic follows mlx-lm's in float32:
/// - top-p: sort ascending; `mass_above[k]` = exclusive reverse cumulative sum of `exp(sorted)`
///   (accumulated from the top down, as MLX's scan does); `total = mass_above[0] + p[0]`;
///   `num_dropped = #{k : mass_above[k] >= top_p * total}`; drop `logprobs < sorted[num_dropped]`.
/// - min-p: drop `logprobs < max + f32(ln(min_p))`.
/// - top-k: keep the k largest; among equal values at the boundary the lower index wins (so
///   `top_k = 1` keeps exactly the greedy token; mlx-lm's argpartition leaves that choice open).
///
/// Because each filter keeps everything at or above some value, applying them one after another
/// (as mlx-lm does) and intersecting them on the original row select the same set.
pub fn filter_logprobs(logprobs: &[f32], params: &SamplingParams) -> Vec<bool> {
    let n = logprobs.len();
    let mut keep: Vec<bool> = logprobs.iter().map(|x| *x > f32::NEG_INFINITY).collect();
    let top_p = params.top_p > 0.0 && params.top_p < 1.0;
    let top_k = params.top_k > 0 && (params.top_k as usize) < n;
    let mut order: Vec<usize> = Vec::new();
    if top_p || top_k {
        // Ascending by value; equal values: higher index first, so the top end of `order`
        // prefers lower indices.
        order = (0..n).collect();
        order.sort_by(|&a, &b| logprobs[a].total_cmp(&logprobs[b]).then(b.cmp(&a)));
    }
    if top_p {
        let probs: Vec<f32> = order.iter().map(|&i| logprobs[i].exp()).collect();
        let mut mass_above = vec![0.0f32; n];
        let mut acc = 0.0f32;
        for k in (0..n).rev() {
            mass_above[k] = acc;
            acc += probs[k];
        }
        let target = params.top_p * acc;
        let dropped = mass_above.iter().filter(|&&m| m >= target).count();
        if dropped < n {
            let threshold = logprobs[order[dropped]];
            for (k, &lp) in keep.iter_mut().zip(logprobs) {
                if lp < threshold {
                    *k = false;
                }
            }
        }
    }
    if params.min_p > 0.0 {
        let top = logprobs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        // mlx-lm: `top + math.log(min_p)`, the float64 log rounded to float32.
        let cut = top + (params.min_p as f64).ln() as f32;
        for (k, &lp) in keep.iter_mut().zip(logprobs) {
            if lp < cut {
                *k = false;
            }
        }
    }
    if top_k {
        for &i in order.iter().rev().skip(params.top_k as usize) {
            keep[i] = false;
        }
    }
    keep
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
