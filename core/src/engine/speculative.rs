//! Prompt-lookup (n-gram) speculative decoding: a row's draft is what followed the latest
//! earlier occurrence of its last n tokens (n = 3, 2, 1) in prompt + output; the executor
//! verifies every row's draft in one `[B, 1 + k]` forward and keeps the accepted prefix.
//! Greedy rows accept draft tokens equal to the argmax (token-exact with plain decoding);
//! sampled rows use rejection sampling against the deterministic draft (a one-hot `q`), which
//! leaves the output distribution unchanged. Rejected positions leave the KV cache through
//! [`crate::cache::BatchRows::trim_rows`].

use rand::Rng;

use crate::sampling::{filter_logprobs, SamplingParams};

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

/// Rejection sampling of a deterministic draft (`q` one-hot): draft token `d` at position `i`
/// is accepted with probability `min(1, p_i(d) / q_i(d)) = p_i(d)`; on the first rejection the
/// next token comes from the residual `max(0, p_i - q_i)` normalized (p_i without `d`); with
/// every draft token accepted, from `p_{len}` (the bonus). `probs[i]` is `p_i`, one more than
/// `draft`. Returns (accepted draft tokens, next token).
pub(super) fn accept_sampled(probs: &[Vec<f32>], draft: &[u32], rng: &mut impl Rng) -> (usize, u32) {
    for (i, &d) in draft.iter().enumerate() {
        let p = &probs[i];
        let pd = p.get(d as usize).copied().unwrap_or(0.0);
        if rng.random::<f32>() < pd {
            continue;
        }
        return (i, draw(p, Some(d as usize), rng));
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
                let (accepted, next) = accept_sampled(&probs, &draft, &mut rng);
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
}
