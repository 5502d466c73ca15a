//! Prompt-lookup (n-gram) speculative decoding: a row's draft is what followed the latest
//! earlier occurrence of its last n tokens (n = 3, 2, 1) in prompt + output; the executor
//! verifies every row's draft in one `[B, 1 + k]` forward and keeps the accepted prefix.
//! Greedy rows accept draft tokens equal to the argmax (token-exact with plain decoding);
//! sampled rows use rejection sampling against the deterministic draft (a one-hot `q`), which
//! leaves the output distribution unchanged. Rejected positions leave the KV cache through
//! [`crate::cache::BatchRows::trim_rows`].
//!
//! With a draft model ([`Drafter`], mlx_lm.server's `--draft-model`), every row's draft comes
//! from a second model sharing the vocabulary instead: it drafts `k` tokens per row
//! autoregressively on its own batched caches (the first `draft_rows` rows of the running
//! batch; rows that joined since catch up in the first draft forward), sampled rows drawing
//! from the draft's own distribution `q`, which rejection sampling then uses (`min(1, p/q)`,
//! residual `max(0, p - q)`).

use std::path::Path;

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::transforms::eval;
use mlx_rs::{Array, Dtype};
use rand::Rng;

use super::row::Row;
use crate::cache::{self, KvCache};
use crate::loading::{LoadOptions, LoadedModel};
use crate::models::LanguageModel;
use crate::prefill::as_f32_slice;
use crate::sampling::{filter_logprobs, Sampler, SamplingParams};
use crate::{Error, Result};

/// A loaded draft model (a model sharing the target's vocabulary, drafting for it).
pub struct Drafter {
    model: Box<dyn LanguageModel>,
}

impl Drafter {
    /// Loads the draft model at `path` with `options` (the target's: same kernels); refuses one
    /// whose vocabulary size differs from `target_vocab` or whose caches cannot drop rejected
    /// positions.
    pub fn load(path: &Path, options: &LoadOptions, target_vocab: i32) -> Result<Drafter> {
        let loaded = crate::loading::load_with(path, options)?;
        Drafter::new(loaded.model, target_vocab)
    }

    /// The draft model `config` names (`EngineConfig::draft_model`), loaded for `target` with
    /// its load options.
    pub fn from_config(config: &super::EngineConfig, target: &LoadedModel) -> Result<Option<Drafter>> {
        let vocab = target.model.info().vocab_size;
        config.draft_model.as_deref().map(|p| Drafter::load(p, &target.options, vocab)).transpose()
    }

    pub fn new(model: Box<dyn LanguageModel>, target_vocab: i32) -> Result<Drafter> {
        let vocab = model.info().vocab_size;
        if vocab != target_vocab {
            return Err(Error::field(
                "draft_model",
                format!("the draft model's vocabulary has {vocab} tokens, the model's {target_vocab}: a draft model must share the tokenizer"),
            ));
        }
        if !cache::trims_rows(model.make_caches()) {
            return Err(Error::Unsupported(
                "the draft model's caches cannot drop rejected draft positions (recurrent or sliding-window layers)".into(),
            ));
        }
        Ok(Drafter { model })
    }

    /// Drafts `k` tokens for every row of `rows` (the whole running batch; `caches` are the
    /// draft's batched caches of its first `*covered` rows, extended here for the others).
    /// Each row first feeds what its draft cache lacks of `prompt ++ generated` (its
    /// `draft_fed` on), right-padded to the longest (the padding leaves as holes), then its own
    /// draft tokens one by one. Returns per row the `k` tokens and, for sampled rows, the draft
    /// distribution each was drawn from. The caches then hold each row's sequence and its first
    /// `k - 1` draft tokens ([`Drafter::keep`] drops the rejected ones).
    pub(super) fn draft(
        &self,
        caches: &mut Vec<Box<dyn KvCache>>,
        covered: &mut usize,
        rows: &mut [Row],
        k: usize,
    ) -> Result<Vec<(Vec<u32>, Option<Vec<Vec<f32>>>)>> {
        // Rows that joined since the last draft get empty draft rows (all padding).
        for b in *covered..rows.len() {
            let fresh: Vec<Box<dyn KvCache>> =
                self.model.make_caches().into_iter().map(|c| c.into_batched()).collect::<Result<_>>()?;
            if caches.is_empty() {
                *caches = fresh;
            } else {
                caches.iter_mut().zip(fresh).try_for_each(|(c, f)| cache::extend_rows(c.as_mut(), f))?;
            }
            rows[b].draft_fed = 0;
        }
        *covered = rows.len();
        let pending: Vec<Vec<u32>> = rows
            .iter()
            .map(|r| r.prompt.iter().chain(&r.generated).skip(r.draft_fed).copied().collect::<Vec<u32>>())
            .collect();
        if pending.iter().any(Vec::is_empty) {
            return Err(Error::Mlx("a row's draft cache is ahead of its tokens".into()));
        }
        // All but each row's last token first, right-padded (the padding leaves as holes): its
        // logits are never read, so the output projection over those positions never runs.
        let width = pending.iter().map(Vec::len).max().unwrap_or(1) - 1;
        if width > 0 {
            let mut input = Vec::with_capacity(rows.len() * width);
            for p in &pending {
                input.extend(&p[..p.len() - 1]);
                input.extend(std::iter::repeat_n(0, width + 1 - p.len()));
            }
            self.model.forward(&Array::from_slice(&input, &[rows.len() as i32, width as i32]), caches)?;
            let pads: Vec<usize> = pending.iter().map(|p| width + 1 - p.len()).collect();
            if pads.iter().any(|&p| p > 0) {
                cache::trim_rows(caches, &pads)?;
            }
        }
        for (row, p) in rows.iter_mut().zip(&pending) {
            row.draft_fed += p.len();
        }
        let last_tokens: Vec<u32> = pending.iter().map(|p| p[p.len() - 1]).collect();
        let sampled: Vec<bool> = rows.iter().map(|r| r.sampler.params().temperature > 0.0).collect();
        let mut out: Vec<(Vec<u32>, Option<Vec<Vec<f32>>>)> =
            sampled.iter().map(|&s| (Vec::with_capacity(k), s.then(Vec::new))).collect();
        let mut inputs = Array::from_slice(&last_tokens, &[rows.len() as i32, 1]);
        for step in 0..k {
            let last = self.model.forward(&inputs, caches)?.index((.., 0, ..));
            let lp = Sampler::logprobs(&last.as_dtype(Dtype::Float32)?)?;
            let argmax = Sampler::argmax(&lp)?.as_dtype(Dtype::Uint32)?;
            let any_sampled = sampled.contains(&true);
            if any_sampled {
                eval([&argmax, &lp])?;
            } else {
                eval([&argmax])?;
            }
            let argmax = argmax.try_as_slice::<u32>().map_err(|e| Error::Mlx(format!("reading draft tokens: {e}")))?.to_vec();
            let lp = if any_sampled { Some(as_f32_slice(&lp)?.to_vec()) } else { None };
            let vocab = last.shape().last().copied().unwrap_or(0) as usize;
            let mut next = Vec::with_capacity(rows.len());
            for (b, row) in rows.iter_mut().enumerate() {
                let token = match (&mut out[b].1, &lp) {
                    (Some(qs), Some(lp)) => {
                        let q = target_probs(&lp[b * vocab..(b + 1) * vocab], row.sampler.params());
                        let t = draw(&q, None, row.sampler.rng());
                        qs.push(q);
                        t
                    }
                    _ => argmax[b],
                };
                out[b].0.push(token);
                next.push(token);
            }
            if step + 1 < k {
                inputs = Array::from_slice(&next, &[rows.len() as i32, 1]);
            }
        }
        Ok(out)
    }

    /// After verification: row `b` kept `accepted[b]` of the `k` draft tokens; its draft
    /// cache keeps its sequence and those of them it fed (at most `k - 1`).
    pub(super) fn keep(caches: &mut [Box<dyn KvCache>], rows: &mut [Row], accepted: &[usize], k: usize) -> Result<()> {
        let fed = k.saturating_sub(1);
        let trims: Vec<usize> = accepted.iter().map(|&a| fed - a.min(fed)).collect();
        for (row, &a) in rows.iter_mut().zip(accepted) {
            row.draft_fed += a.min(fed);
        }
        if trims.iter().any(|&t| t > 0) {
            cache::trim_rows(caches, &trims)?;
        }
        Ok(())
    }
}

/// Longest n-gram matched first.
const MAX_NGRAM: usize = 3;

/// Up to `k` tokens that followed the most recent earlier occurrence of the sequence's last
/// n-gram (n from [`MAX_NGRAM`] down to 1); empty when none occurred.
pub(super) fn lookup(prompt: &[u32], generated: &[u32], k: usize) -> Vec<u32> {
    if k == 0 {
        return Vec::new();
    }
    let seq: Vec<u32> = prompt.iter().chain(generated).copied().collect();
    let len = seq.len();
    for n in (1..=MAX_NGRAM.min(len.saturating_sub(1))).rev() {
        let tail = &seq[len - n..];
        // Starts of earlier occurrences, latest first; one must have a token after it.
        if let Some(start) = (0..len - n).rev().find(|&i| &seq[i..i + n] == tail) {
            let from = start + n;
            return seq[from..(from + k).min(len)].to_vec();
        }
    }
    Vec::new()
}

/// Greedy verification: how many leading draft tokens equal the argmax at their position
/// (`argmax[i]` is the choice after input `i`; input 0 is the row's last token, input `i + 1`
/// is `draft[i]`). The next token is then `argmax[accepted]`.
pub(super) fn accept_greedy(argmax: &[u32], draft: &[u32]) -> usize {
    draft.iter().zip(argmax).take_while(|(d, a)| d == a).count()
}

/// The distribution a sampled row draws from at one position: the row's filters (top-p,
/// min-p, top-k) over float32 log-probabilities, then `softmax(logprobs / T)` on the kept
/// tokens (what the Gumbel-max draw of [`crate::sampling`] samples from).
pub(super) fn target_probs(logprobs: &[f32], params: &SamplingParams) -> Vec<f32> {
    let keep = filter_logprobs(logprobs, params);
    let inv_t = 1.0 / params.temperature.max(f32::MIN_POSITIVE);
    let top = logprobs.iter().zip(&keep).filter(|(_, k)| **k).map(|(x, _)| *x).fold(f32::NEG_INFINITY, f32::max);
    let mut p: Vec<f32> =
        logprobs.iter().zip(&keep).map(|(x, k)| if *k { ((x - top) * inv_t).exp() } else { 0.0 }).collect();
    let total: f32 = p.iter().sum();
    if total > 0.0 {
        p.iter_mut().for_each(|x| *x /= total);
    }
    p
}

/// Rejection sampling of a draft: token `d` at position `i` is accepted with probability
/// `min(1, p_i(d) / q_i(d))`; on the first rejection the next token comes from the residual
/// `max(0, p_i - q_i)` normalized; with every draft token accepted, from `p_{len}` (the bonus).
/// `q` holds a draft model's distributions, one per draft token; `None` is a deterministic
/// draft (prompt lookup: `q_i` all on `d`), whose acceptance is `p_i(d)` and whose residual is
/// `p_i` without `d`. `probs[i]` is `p_i`, one more than `draft`. Returns (accepted draft
/// tokens, next token).
pub(super) fn accept_sampled(probs: &[Vec<f32>], q: Option<&[Vec<f32>]>, draft: &[u32], rng: &mut impl Rng) -> (usize, u32) {
    for (i, &d) in draft.iter().enumerate() {
        let p = &probs[i];
        let pd = p.get(d as usize).copied().unwrap_or(0.0);
        let qd = q.map_or(1.0, |q| q[i].get(d as usize).copied().unwrap_or(0.0));
        if qd > 0.0 && rng.random::<f32>() * qd < pd {
            continue;
        }
        let Some(q) = q else { return (i, draw(p, Some(d as usize), rng)) };
        let residual: Vec<f32> = p.iter().zip(&q[i]).map(|(p, q)| (p - q).max(0.0)).collect();
        // p == q leaves no residual mass (then a rejection has probability 0 anyway).
        let next = if residual.iter().any(|&x| x > 0.0) { draw(&residual, None, rng) } else { draw(p, None, rng) };
        return (i, next);
    }
    (draft.len(), draw(&probs[draft.len()], None, rng))
}

/// One draw from `p` with entry `skip` removed (renormalized by the mass left).
fn draw(p: &[f32], skip: Option<usize>, rng: &mut impl Rng) -> u32 {
    let mass: f64 = p.iter().enumerate().filter(|(i, _)| Some(*i) != skip).map(|(_, x)| *x as f64).sum();
    let mut u = rng.random::<f64>() * mass;
    let mut last = None;
    for (i, &x) in p.iter().enumerate() {
        if Some(i) == skip || x <= 0.0 {
            continue;
        }
        last = Some(i);
        u -= x as f64;
        if u < 0.0 {
            return i as u32;
        }
    }
    // Rounding left a sliver: the last token with mass (or the skipped one if it was all).
    last.or(skip).unwrap_or(0) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    #[test]
    fn lookup_takes_what_followed_the_latest_longest_match() {
        // "1 2 3 9" then later "1 2 3": the 3-gram matches, 9 and what follows come next.
        let prompt = [1, 2, 3, 9, 8, 7, 5, 1, 2, 3];
        assert_eq!(lookup(&prompt, &[], 3), vec![9, 8, 7]);
        // The draft may run into the generated tokens and stops at the sequence's end.
        assert_eq!(lookup(&[4, 5, 6], &[4, 5], 4), vec![6, 4, 5]);
        // No earlier occurrence of any suffix: no draft.
        assert!(lookup(&[1, 2, 3], &[4], 4).is_empty());
        // Falls back to a 1-gram; the latest occurrence wins.
        assert_eq!(lookup(&[7, 1, 7, 2, 9, 7], &[], 1), vec![2]);
        assert!(lookup(&[1, 1], &[], 0).is_empty());
    }

    #[test]
    fn greedy_acceptance_is_the_matching_prefix() {
        assert_eq!(accept_greedy(&[5, 6, 7, 8], &[5, 6, 0]), 2);
        assert_eq!(accept_greedy(&[5, 6, 7, 8], &[5, 6, 7]), 3);
        assert_eq!(accept_greedy(&[5, 6], &[1]), 0);
    }

    #[test]
    fn target_probs_follow_temperature_and_filters() {
        let lp: Vec<f32> = [0.5f32, 0.3, 0.2].iter().map(|p| p.ln()).collect();
        let p = target_probs(&lp, &SamplingParams { temperature: 1.0, ..SamplingParams::default() });
        assert!((p[0] - 0.5).abs() < 1e-6 && (p[2] - 0.2).abs() < 1e-6);
        let p = target_probs(&lp, &SamplingParams { temperature: 1.0, top_k: 2, ..SamplingParams::default() });
        assert!((p[0] - 0.625).abs() < 1e-6 && p[2] == 0.0);
    }

    /// The tokens rejection sampling emits have the target distribution whatever the draft:
    /// the first token's frequencies over many draws match `p_0`, for a likely, an unlikely
    /// and an impossible draft token; the second token (after an accepted first) matches `p_1`.
    #[test]
    fn rejection_sampling_keeps_the_distribution() {
        let p0 = vec![0.5f32, 0.3, 0.15, 0.05, 0.0];
        let p1 = vec![0.1f32, 0.2, 0.3, 0.4, 0.0];
        let p2 = vec![0.25f32; 4].into_iter().chain([0.0]).collect::<Vec<_>>();
        let probs = vec![p0.clone(), p1.clone(), p2];
        let mut rng = StdRng::seed_from_u64(7);
        let n = 200_000;
        for first in [0u32, 3, 4] {
            let draft = [first, 2];
            let mut counts0 = [0usize; 5];
            let mut counts1 = [0usize; 5];
            let mut seconds = 0;
            for _ in 0..n {
                let (accepted, next) = accept_sampled(&probs, None, &draft, &mut rng);
                let emitted: Vec<u32> = draft[..accepted].iter().copied().chain([next]).collect();
                counts0[emitted[0] as usize] += 1;
                if let Some(&t) = emitted.get(1) {
                    counts1[t as usize] += 1;
                    seconds += 1;
                }
            }
            for (t, &p) in p0.iter().enumerate() {
                let f = counts0[t] as f32 / n as f32;
                assert!((f - p).abs() < 0.005, "draft {draft:?}: token {t} at {f}, want {p}");
            }
            if seconds > 10_000 {
                for (t, &p) in p1.iter().enumerate() {
                    let f = counts1[t] as f32 / seconds as f32;
                    assert!((f - p).abs() < 0.01, "draft {draft:?}: second token {t} at {f}, want {p}");
                }
            }
        }
    }

    /// With a draft drawn from a draft model's `q`, the `min(1, p/q)` rule and the residual
    /// `max(0, p - q)` give tokens distributed as the target's `p`, position by position, for
    /// a `q` near `p`, one far from it, and `q = p` (every draft accepted).
    #[test]
    fn rejection_sampling_with_draft_probabilities_keeps_the_distribution() {
        let p = vec![vec![0.5f32, 0.3, 0.15, 0.05], vec![0.1f32, 0.2, 0.3, 0.4], vec![0.25f32; 4]];
        let qs = [
            vec![vec![0.4f32, 0.4, 0.1, 0.1], vec![0.2f32, 0.2, 0.2, 0.4]],
            vec![vec![0.05f32, 0.05, 0.1, 0.8], vec![0.7f32, 0.1, 0.1, 0.1]],
            vec![p[0].clone(), p[1].clone()],
        ];
        let mut rng = StdRng::seed_from_u64(11);
        let n = 200_000;
        for q in &qs {
            let mut counts = [[0usize; 4]; 2];
            let mut seen = [0usize; 2];
            let mut accepted_all = 0;
            for _ in 0..n {
                let draft = [draw(&q[0], None, &mut rng), draw(&q[1], None, &mut rng)];
                let (accepted, next) = accept_sampled(&p, Some(q), &draft, &mut rng);
                accepted_all += usize::from(accepted == 2);
                let emitted: Vec<u32> = draft[..accepted].iter().copied().chain([next]).collect();
                for (i, &t) in emitted.iter().take(2).enumerate() {
                    counts[i][t as usize] += 1;
                    seen[i] += 1;
                }
            }
            for i in 0..2 {
                for t in 0..4 {
                    let f = counts[i][t] as f32 / seen[i] as f32;
                    assert!((f - p[i][t]).abs() < 0.006, "q {q:?}: position {i} token {t} at {f}, want {}", p[i][t]);
                }
            }
            if q[0] == p[0] {
                assert_eq!(accepted_all, n);
            }
        }
    }
}
