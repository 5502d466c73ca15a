//! Resampling exactly as the reference does it: mlx-audio's `resample_audio` is scipy's
//! `resample_poly(x, up, down, window=fir, padtype="edge")` with a Kaiser-windowed sinc FIR
//! (`firwin(2 * 64 * max(up, down) + 1, 0.9475937167399596 / max(up, down),
//! window=("kaiser", 14.769656459379492))`, resampy's `kaiser_best`). scipy filters in float64
//! and returns float32; so does this port. Only the summation order differs, which moves a
//! float32 result by at most about an ulp.

use crate::{Error, Result};

const NUM_ZEROS: usize = 64;
/// Largest `max(up, down)` of a reduced ratio the resampler takes: the filter has
/// `2 * 64 * max(up, down) + 1` float64 taps (49 MB here). Every rate up to 48 kHz and every
/// standard rate above it (all multiples of 8 Hz up to 384 kHz) fits.
pub const MAX_RATIO_TERM: u64 = 48_000;
const ROLLOFF: f64 = 0.9475937167399596;
const KAISER_BETA: f64 = 14.769656459379492;

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The modified Bessel function of the first kind, order 0 (power series; converges quickly
/// for the Kaiser betas used here).
fn bessel_i0(x: f64) -> f64 {
    let q = x * x / 4.0;
    let (mut term, mut sum) = (1.0f64, 1.0f64);
    for k in 1..500 {
        term *= q / (k as f64 * k as f64);
        sum += term;
        if term < sum * 1e-17 {
            break;
        }
    }
    sum
}

/// scipy `firwin(numtaps, cutoff, window=("kaiser", beta))`: a low-pass with unit DC gain.
fn firwin_kaiser(numtaps: usize, cutoff: f64, beta: f64) -> Result<Vec<f64>> {
    let alpha = (numtaps - 1) as f64 / 2.0;
    let i0_beta = bessel_i0(beta);
    let mut h = Vec::new();
    h.try_reserve_exact(numtaps).map_err(|_| oom(numtaps))?;
    h.extend((0..numtaps).map(|n| {
            let m = n as f64 - alpha;
            // numpy's sinc: sin(pi x) / (pi x), with x = 0 nudged to 1e-20.
            let x = cutoff * m;
            let y = std::f64::consts::PI * if x == 0.0 { 1.0e-20 } else { x };
            let sinc = y.sin() / y;
            let r = (n as f64 - alpha) / alpha;
            let w = bessel_i0(beta * (1.0 - r * r).max(0.0).sqrt()) / i0_beta;
            cutoff * sinc * w
        }));
    let s: f64 = h.iter().sum();
    for v in &mut h {
        *v /= s;
    }
    Ok(h)
}

fn oom(n: usize) -> Error {
    Error::Capacity(format!("audio: out of memory resampling ({n} values)"))
}

/// Resamples `x` from `from_rate` to `to_rate` Hz (scipy `resample_poly` with edge padding
/// and mlx-audio's filter). The output has `ceil(len * up / down)` samples. Rates whose
/// reduced ratio has a term above [`MAX_RATIO_TERM`] (or a zero rate) are an `InvalidRequest`
/// error: the filter would be sized from them.
pub fn resample(x: &[f32], from_rate: u32, to_rate: u32) -> Result<Vec<f32>> {
    if from_rate == 0 || to_rate == 0 {
        return Err(Error::InvalidRequest(format!("audio: cannot resample {from_rate} Hz to {to_rate} Hz")));
    }
    if from_rate == to_rate || x.is_empty() {
        return Ok(x.to_vec());
    }
    let g = gcd(from_rate as u64, to_rate as u64);
    let (up, down) = (to_rate as u64 / g, from_rate as u64 / g);
    if up.max(down) > MAX_RATIO_TERM {
        return Err(Error::InvalidRequest(format!(
            "audio: {from_rate} Hz does not resample to {to_rate} Hz with a bounded filter (the ratio \
             reduces to {up}/{down}; terms up to {MAX_RATIO_TERM} are supported, which every rate up \
             to 48 kHz and every multiple of 8 Hz up to 384 kHz meets)"
        )));
    }
    let (up, down) = (up as usize, down as usize);
    let max_rate = up.max(down);
    let h = firwin_kaiser(2 * NUM_ZEROS * max_rate + 1, ROLLOFF / max_rate as f64, KAISER_BETA)?;
    let half_len = (h.len() - 1) / 2;
    let n_in = x.len();
    let n_out = n_in.checked_mul(up).ok_or_else(|| oom(usize::MAX))?.div_ceil(down);
    // Output m is centred on upsampled position m * down: y[m] = up * sum_i x_edge[i] *
    // h[m * down + half_len - i * up], x_edge repeating the first / last sample outside the clip.
    let last = (n_in - 1) as i64;
    let mut y = Vec::new();
    y.try_reserve_exact(n_out).map_err(|_| oom(n_out))?;
    y.extend((0..n_out).map(|m| {
        let centre = (m * down + half_len) as i64;
        let i_hi = centre.div_euclid(up as i64);
        let i_lo = (centre - (h.len() as i64 - 1)).div_euclid(up as i64)
            + i64::from((centre - (h.len() as i64 - 1)).rem_euclid(up as i64) != 0);
        let mut acc = 0f64;
        for i in i_lo..=i_hi {
            let k = (centre - i * up as i64) as usize;
            acc += x[i.clamp(0, last) as usize] as f64 * h[k];
        }
        (acc * up as f64) as f32
    }));
    Ok(y)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn i0_matches_known_values() {
        // scipy.special.i0(1.0), i0(14.769656459379492)
        assert!((bessel_i0(1.0) - 1.2660658777520082).abs() < 1e-15);
        let v = bessel_i0(KAISER_BETA);
        assert!((v / 271903.6406814566 - 1.0).abs() < 1e-13, "{v}");
    }

    #[test]
    fn constant_signal_stays_constant() {
        // Edge padding plus a unit-gain filter: a DC clip resamples to the same DC level.
        let y = resample(&[0.25f32; 441], 44_100, 16_000).unwrap();
        assert_eq!(y.len(), 160);
        assert!(y.iter().all(|v| (v - 0.25).abs() < 1e-5), "{:?}", &y[..4]);
    }

    #[test]
    fn ratios_with_huge_terms_are_refused_before_any_filter_is_built() {
        // 4 294 967 295 Hz reduces to 3200/858993459 against 16 kHz: an 880 GB filter.
        let e = resample(&[0.0; 8], u32::MAX, 16_000).unwrap_err().to_string();
        assert!(e.contains("bounded filter"), "{e}");
        assert!(resample(&[0.0; 8], 383_999, 16_000).is_err());
        assert!(resample(&[0.0; 8], 0, 16_000).is_err());
        assert_eq!(resample(&[0.0; 8], 384_000, 16_000).unwrap().len(), 1);
    }
}
