//! Gemma 4's USM log-mel frontend, a port of mlx-vlm's `Gemma4AudioFeatureExtractor` (itself
//! transformers' extractor) for one clip:
//!
//! 1. truncate to `max_samples` (30 s), pad with zeros to a multiple of 128 samples;
//! 2. prepend `frame_length / 2` zeros (semicausal: frame 0 is centred on t = 0);
//! 3. frames of `frame_length + 1` samples every `hop_length`; the last sample only serves the
//!    (HTK-flavoured) preemphasis, else it is dropped;
//! 4. periodic Hann window (computed in float32 as numpy does), `|rfft|` with `fft_length` =
//!    the next power of two (512), times the HTK mel filter bank (transformers'
//!    `mel_filter_bank(norm=None, mel_scale="htk")`, float64), `log(mel + mel_floor)`;
//! 5. optional per-bin mean / stddev; frames whose last sample lies in the padding are masked
//!    and zeroed.
//!
//! numpy runs the FFT in float32 (numpy >= 2 keeps the input precision); this port runs it in
//! float64, so features agree to ~1e-5 (the golden test states the bound it checks).

use crate::{Error, Result};

/// The extractor's settings (the fields of `preprocessor_config.json` it reads; defaults are
/// the class defaults, which the Gemma 4 checkpoints use).
#[derive(Debug, Clone)]
pub struct MelConfig {
    pub feature_size: usize,
    pub sampling_rate: u32,
    pub frame_length_ms: f64,
    pub hop_length_ms: f64,
    pub min_frequency: f64,
    pub max_frequency: f64,
    pub preemphasis: f64,
    pub preemphasis_htk_flavor: bool,
    pub fft_overdrive: bool,
    pub input_scale_factor: f64,
    pub mel_floor: f64,
    pub per_bin_mean: Option<Vec<f64>>,
    pub per_bin_stddev: Option<Vec<f64>>,
    /// Longer clips are truncated here (the extractor's `max_length`, 30 s at 16 kHz).
    pub max_samples: usize,
    /// Waveforms are zero-padded to a multiple of this (`pad_to_multiple_of`).
    pub pad_to_multiple_of: usize,
}

impl Default for MelConfig {
    fn default() -> Self {
        MelConfig {
            feature_size: 128,
            sampling_rate: 16_000,
            frame_length_ms: 20.0,
            hop_length_ms: 10.0,
            min_frequency: 0.0,
            max_frequency: 8000.0,
            preemphasis: 0.0,
            preemphasis_htk_flavor: true,
            fft_overdrive: false,
            input_scale_factor: 1.0,
            mel_floor: 1e-3,
            per_bin_mean: None,
            per_bin_stddev: None,
            max_samples: 480_000,
            pad_to_multiple_of: 128,
        }
    }
}

impl MelConfig {
    /// The extractor's settings among a model directory's processor configs (a
    /// [`crate::vision::PROCESSOR_CONFIG_KEY`] value), as mlx-vlm's Gemma4Processor finds them:
    /// the `feature_extractor` object of `processor_config.json`, else of
    /// `preprocessor_config.json`; the class defaults when neither file has one.
    pub fn from_processor_configs(configs: Option<&serde_json::Value>) -> Result<Self> {
        let file = configs.and_then(|c| c.get("processor_config.json").or_else(|| c.get("preprocessor_config.json")));
        match file.and_then(|f| f.get("feature_extractor")).filter(|fe| fe.is_object()) {
            Some(fe) => MelConfig::from_json(fe),
            None => Ok(MelConfig::default()),
        }
    }

    /// Reads the extractor fields of a `preprocessor_config.json` (or its `feature_extractor`
    /// object); missing fields keep their defaults. `dither > 0` is refused: it is random.
    pub fn from_json(v: &serde_json::Value) -> Result<Self> {
        let v = v.get("feature_extractor").unwrap_or(v);
        let mut c = MelConfig::default();
        let f = |k: &str| v.get(k).and_then(|x| x.as_f64());
        let b = |k: &str| v.get(k).and_then(|x| x.as_bool());
        let list = |k: &str| -> Option<Vec<f64>> {
            v.get(k).and_then(|x| x.as_array()).map(|a| a.iter().filter_map(|e| e.as_f64()).collect())
        };
        if let Some(x) = f("feature_size") {
            c.feature_size = x as usize;
        }
        if let Some(x) = f("sampling_rate") {
            c.sampling_rate = x as u32;
        }
        if let Some(x) = f("frame_length_ms") {
            c.frame_length_ms = x;
        }
        if let Some(x) = f("hop_length_ms") {
            c.hop_length_ms = x;
        }
        if let Some(x) = f("min_frequency") {
            c.min_frequency = x;
        }
        if let Some(x) = f("max_frequency") {
            c.max_frequency = x;
        }
        if let Some(x) = f("preemphasis") {
            c.preemphasis = x;
        }
        if let Some(x) = b("preemphasis_htk_flavor") {
            c.preemphasis_htk_flavor = x;
        }
        if let Some(x) = b("fft_overdrive") {
            c.fft_overdrive = x;
        }
        if let Some(x) = f("input_scale_factor") {
            c.input_scale_factor = x;
        }
        if let Some(x) = f("mel_floor") {
            c.mel_floor = x;
        }
        c.per_bin_mean = list("per_bin_mean");
        c.per_bin_stddev = list("per_bin_stddev");
        if f("dither").is_some_and(|d| d > 0.0) {
            return Err(Error::Unsupported("audio feature extractor: dither > 0 (random features)".into()));
        }
        for (name, l) in [("per_bin_mean", &c.per_bin_mean), ("per_bin_stddev", &c.per_bin_stddev)] {
            if l.as_ref().is_some_and(|l| l.len() != c.feature_size) {
                return Err(Error::ModelLoad(format!("audio feature extractor: {name} must have feature_size entries")));
            }
        }
        Ok(c)
    }
}

/// Log-mel features of one clip: `frames x bins`, row-major, and which frames are real audio.
#[derive(Debug, Clone)]
pub struct MelFeatures {
    pub frames: usize,
    pub bins: usize,
    pub data: Vec<f32>,
    /// `true` = the frame ends inside the clip (the extractor's `input_features_mask`).
    pub valid: Vec<bool>,
}

/// The frontend with its window and filter bank computed once.
pub struct MelFrontend {
    cfg: MelConfig,
    frame_length: usize,
    hop_length: usize,
    fft_length: usize,
    window: Vec<f32>,
    /// Per mel bin: the first FFT bin its triangle covers and its weights from there (the
    /// filter bank is `(fft_length / 2 + 1) x feature_size` but each column is mostly zero).
    filters: Vec<(usize, Vec<f64>)>,
    twiddles: Vec<(f64, f64)>,
}

/// numpy's `linspace(start, stop, num)`: `i * step + start`, the last point exactly `stop`.
fn linspace(start: f64, stop: f64, num: usize) -> Vec<f64> {
    let step = (stop - start) / (num - 1) as f64;
    let mut v: Vec<f64> = (0..num).map(|i| i as f64 * step + start).collect();
    v[num - 1] = stop;
    v
}

fn hz_to_mel(f: f64) -> f64 {
    2595.0 * (1.0 + f / 700.0).log10()
}

fn mel_to_hz(m: f64) -> f64 {
    700.0 * (10f64.powf(m / 2595.0) - 1.0)
}

/// In-place iterative radix-2 complex FFT (`re.len()` a power of two); `twiddles[k]` =
/// `(cos, sin)(-2 pi k / n)` for `k < n / 2`.
fn fft(re: &mut [f64], im: &mut [f64], twiddles: &[(f64, f64)]) {
    let n = re.len();
    let mut j = 0;
    for i in 1..n {
        let mut bit = n >> 1;
        while j & bit != 0 {
            j ^= bit;
            bit >>= 1;
        }
        j |= bit;
        if i < j {
            re.swap(i, j);
            im.swap(i, j);
        }
    }
    let mut len = 2;
    while len <= n {
        let stride = n / len;
        for start in (0..n).step_by(len) {
            for k in 0..len / 2 {
                let (c, s) = twiddles[k * stride];
                let (a, b) = (start + k, start + k + len / 2);
                let tr = re[b] * c - im[b] * s;
                let ti = re[b] * s + im[b] * c;
                re[b] = re[a] - tr;
                im[b] = im[a] - ti;
                re[a] += tr;
                im[a] += ti;
            }
        }
        len <<= 1;
    }
}

fn twiddles(n: usize) -> Vec<(f64, f64)> {
    (0..n / 2)
        .map(|k| {
            let (s, c) = (-2.0 * std::f64::consts::PI * k as f64 / n as f64).sin_cos();
            (c, s)
        })
        .collect()
}

impl MelFrontend {
    pub fn new(cfg: MelConfig) -> Result<Self> {
        let frame_length = (cfg.sampling_rate as f64 * cfg.frame_length_ms / 1000.0).round() as usize;
        let hop_length = (cfg.sampling_rate as f64 * cfg.hop_length_ms / 1000.0).round() as usize;
        if frame_length < 2 || hop_length == 0 || cfg.feature_size == 0 {
            return Err(Error::ModelLoad("audio feature extractor: frame / hop / feature size too small".into()));
        }
        let mut fft_length = frame_length.next_power_of_two();
        if cfg.fft_overdrive {
            fft_length *= 2;
        }
        // float32 all the way, as numpy computes `0.5 - 0.5 * cos(2 pi arange(N, f32) / N)`.
        let window = (0..frame_length)
            .map(|n| {
                let x = 2.0f32 * std::f32::consts::PI * n as f32 / frame_length as f32;
                0.5f32 - 0.5f32 * x.cos()
            })
            .collect();
        let n_freq = fft_length / 2 + 1;
        let fft_freqs = linspace(0.0, (cfg.sampling_rate / 2) as f64, n_freq);
        let mel_freqs = linspace(hz_to_mel(cfg.min_frequency), hz_to_mel(cfg.max_frequency), cfg.feature_size + 2);
        let filter_freqs: Vec<f64> = mel_freqs.iter().map(|&m| mel_to_hz(m)).collect();
        let filters = (0..cfg.feature_size)
            .map(|m| {
                let column: Vec<f64> = fft_freqs
                    .iter()
                    .map(|&freq| {
                        let down = -(filter_freqs[m] - freq) / (filter_freqs[m + 1] - filter_freqs[m]);
                        let up = (filter_freqs[m + 2] - freq) / (filter_freqs[m + 2] - filter_freqs[m + 1]);
                        0f64.max(down.min(up))
                    })
                    .collect();
                let first = column.iter().position(|&v| v != 0.0).unwrap_or(0);
                let last = column.iter().rposition(|&v| v != 0.0).map_or(0, |l| l + 1);
                (first, column[first..last.max(first)].to_vec())
            })
            .collect();
        let twiddles = twiddles(fft_length);
        Ok(MelFrontend { cfg, frame_length, hop_length, fft_length, window, filters, twiddles })
    }

    pub fn config(&self) -> &MelConfig {
        &self.cfg
    }

    /// Frames [`MelFrontend::features`] makes of a clip of `samples` samples (0: too short).
    pub fn frames_for(&self, samples: usize) -> usize {
        let c = &self.cfg;
        let mult = c.pad_to_multiple_of.max(1);
        let total = self.frame_length / 2 + samples.min(c.max_samples).div_ceil(mult) * mult;
        let unfold = self.frame_length + 1;
        if total < unfold { 0 } else { (total - unfold) / self.hop_length + 1 }
    }

    /// The fewest samples that make at least `frames` frames (`max_samples` if none do).
    pub fn min_samples(&self, frames: usize) -> usize {
        // `frames_for` never decreases with the length: binary search.
        let (mut lo, mut hi) = (0, self.cfg.max_samples);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.frames_for(mid) >= frames { hi = mid } else { lo = mid + 1 }
        }
        lo
    }

    /// Features of one mono clip at `config().sampling_rate`.
    pub fn features(&self, samples: &[f32]) -> Result<MelFeatures> {
        let c = &self.cfg;
        let samples = &samples[..samples.len().min(c.max_samples)];
        let mult = c.pad_to_multiple_of.max(1);
        let padded_len = samples.len().div_ceil(mult) * mult;
        let pad_left = self.frame_length / 2;
        // The padded waveform: pad_left zeros, the clip, zeros up to the multiple.
        let total = pad_left + padded_len;
        let unfold = self.frame_length + 1;
        if total < unfold {
            return Err(Error::InvalidRequest(format!(
                "audio: the clip is too short ({} samples, not one {} ms frame)",
                samples.len(),
                c.frame_length_ms
            )));
        }
        let sample_at = |i: usize| -> f32 {
            if i < pad_left || i - pad_left >= samples.len() {
                0.0
            } else {
                let s = samples[i - pad_left];
                if c.input_scale_factor != 1.0 { (s as f64 * c.input_scale_factor) as f32 } else { s }
            }
        };
        let frames = (total - unfold) / self.hop_length + 1;
        let bins = c.feature_size;
        let n_freq = self.fft_length / 2 + 1;
        let mut data = Vec::new();
        super::decode::reserve(&mut data, frames * bins)?;
        data.resize(frames * bins, 0f32);
        let mut valid = vec![false; frames];
        let (mut re, mut im) = (vec![0f64; self.fft_length], vec![0f64; self.fft_length]);
        let mut mag = vec![0f64; n_freq];
        let p = c.preemphasis as f32;
        for t in 0..frames {
            let start = t * self.hop_length;
            re.iter_mut().for_each(|v| *v = 0.0);
            im.iter_mut().for_each(|v| *v = 0.0);
            for n in 0..self.frame_length {
                let x = if c.preemphasis > 0.0 {
                    if c.preemphasis_htk_flavor {
                        if n == 0 { sample_at(start) * (1.0 - p) } else { sample_at(start + n) - p * sample_at(start + n - 1) }
                    } else {
                        sample_at(start + n + 1) - p * sample_at(start + n)
                    }
                } else {
                    sample_at(start + n)
                };
                re[n] = (x * self.window[n]) as f64;
            }
            fft(&mut re, &mut im, &self.twiddles);
            for (k, m) in mag.iter_mut().enumerate() {
                *m = (re[k] * re[k] + im[k] * im[k]).sqrt();
            }
            // The frame is real audio when its last unfolded sample is (the extractor's mask).
            let end = start + unfold - 1;
            valid[t] = end >= pad_left && end - pad_left < samples.len();
            if !valid[t] {
                continue; // masked frames are zeroed
            }
            let row = &mut data[t * bins..(t + 1) * bins];
            for (m, out) in row.iter_mut().enumerate() {
                let (first, weights) = &self.filters[m];
                let acc: f64 = weights.iter().zip(&mag[*first..]).map(|(w, v)| w * v).sum();
                let mut v = (acc + c.mel_floor).ln();
                if let Some(mean) = &c.per_bin_mean {
                    v -= mean[m];
                }
                if let Some(std) = &c.per_bin_stddev {
                    v /= std[m];
                }
                *out = v as f32;
            }
        }
        Ok(MelFeatures { frames, bins, data, valid })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fft_matches_a_direct_dft() {
        let n = 16;
        let x: Vec<f64> = (0..n).map(|i| ((i * 7 % 5) as f64) - 1.5).collect();
        let (mut re, mut im) = (x.clone(), vec![0.0; n]);
        fft(&mut re, &mut im, &twiddles(n));
        for k in 0..n {
            let (mut r, mut i) = (0.0, 0.0);
            for (t, &v) in x.iter().enumerate() {
                let a = -2.0 * std::f64::consts::PI * (k * t) as f64 / n as f64;
                r += v * a.cos();
                i += v * a.sin();
            }
            assert!((re[k] - r).abs() < 1e-9 && (im[k] - i).abs() < 1e-9, "bin {k}");
        }
    }
}
