//! Resampling exactly as the reference does it: mlx-audio's `resample_audio` is scipy's
//! `resample_poly(x, up, down, window=fir, padtype="edge")` with a Kaiser-windowed sinc FIR
//! (`firwin(2 * 64 * max(up, down) + 1, 0.9475937167399596 / max(up, down),
//! window=("kaiser", 14.769656459379492))`, resampy's `kaiser_best`). scipy filters in float64
//! and returns float32; so does this port. Only the summation order differs, which moves a
//! float32 result by at most about an ulp.

const NUM_ZEROS: usize = 64;
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
fn firwin_kaiser(numtaps: usize, cutoff: f64, beta: f64) -> Vec<f64> {
    let alpha = (numtaps - 1) as f64 / 2.0;
    let i0_beta = bessel_i0(beta);
    let mut h: Vec<f64> = (0..numtaps)
        .map(|n| {
            let m = n as f64 - alpha;
            // numpy's sinc: sin(pi x) / (pi x), with x = 0 nudged to 1e-20.
            let x = cutoff * m;
            let y = std::f64::consts::PI * if x == 0.0 { 1.0e-20 } else { x };
            let sinc = y.sin() / y;
            let r = (n as f64 - alpha) / alpha;
            let w = bessel_i0(beta * (1.0 - r * r).max(0.0).sqrt()) / i0_beta;
            cutoff * sinc * w
        })
        .collect();
    let s: f64 = h.iter().sum();
    for v in &mut h {
        *v /= s;
    }
    h
}

/// Resamples `x` from `from_rate` to `to_rate` Hz (scipy `resample_poly` with edge padding
/// and mlx-audio's filter). The output has `ceil(len * up / down)` samples.
pub fn resample(x: &[f32], from_rate: u32, to_rate: u32) -> Vec<f32> {
    if from_rate == to_rate || x.is_empty() {
        return x.to_vec();
    }
    let g = gcd(from_rate as u64, to_rate as u64);
    let (up, down) = ((to_rate as u64 / g) as usize, (from_rate as u64 / g) as usize);
    let max_rate = up.max(down);
    let h = firwin_kaiser(2 * NUM_ZEROS * max_rate + 1, ROLLOFF / max_rate as f64, KAISER_BETA);
    let half_len = (h.len() - 1) / 2;
    let n_in = x.len();
    let n_out = (n_in * up).div_ceil(down);
    // Output m is centred on upsampled position m * down: y[m] = up * sum_i x_edge[i] *
    // h[m * down + half_len - i * up], x_edge repeating the first / last sample outside the clip.
    let last = (n_in - 1) as i64;
    (0..n_out)
        .map(|m| {
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
        })
        .collect()
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
        let y = resample(&[0.25f32; 441], 44_100, 16_000);
        assert_eq!(y.len(), 160);
        assert!(y.iter().all(|v| (v - 0.25).abs() < 1e-5), "{:?}", &y[..4]);
    }
}
