//! Audio input for Gemma 4: bytes -> 16 kHz mono -> USM log-mel features -> (the tower in
//! `models::gemma4_audio`) -> soft tokens spliced into the prompt as `boa + audio x n + eoa`.
//!
//! Every step follows mlx-vlm 0.7.10 (the oracle, goldens/make_audio_goldens.py): its
//! `load_audio` (decode, `mean` downmix, mlx-audio's Kaiser polyphase resampler), its
//! `Gemma4AudioFeatureExtractor` and its processor's soft-token rule.

mod decode;
mod mel;
mod resample;
mod splice;

pub use decode::{decode_mono, MonoAudio};
pub use mel::{MelConfig, MelFeatures, MelFrontend};
pub use resample::resample;
pub use splice::{expand_audio_placeholders, splice_soft_tokens, AudioTokens};

use crate::{Error, Result};

/// The rate the frontend and the tower work at.
pub const SAMPLE_RATE: u32 = 16_000;
use crate::limits::{MAX_AUDIO_SECONDS as MAX_SECONDS, MAX_SAMPLE_RATE, MIN_SAMPLE_RATE};
/// Mel frames the Gemma 4 audio tower needs at least (its two stride-2 convolutions).
pub const MIN_MEL_FRAMES: usize = 3;

/// Decodes `bytes` (WAV / MP3 / FLAC / Ogg Vorbis), downmixes to mono and resamples to 16 kHz,
/// as the reference's `load_audio(file, sr=16000)`. Clips over [`MAX_SECONDS`], sample rates
/// outside [`MIN_SAMPLE_RATE`]..=[`MAX_SAMPLE_RATE`] (or that the resampler cannot take, see
/// [`resample`]), empty clips and unsupported formats are `InvalidRequest` errors that say so.
pub fn load_clip(bytes: &[u8], format_hint: Option<&str>) -> Result<Vec<f32>> {
    // Decoding stops a little past the limit; the exact check is on the 16 kHz length.
    let mono = decode_mono(bytes, format_hint, MAX_SECONDS + 1.0)?;
    let samples = resample(&mono.samples, mono.sample_rate, SAMPLE_RATE)?;
    let max = (MAX_SECONDS * SAMPLE_RATE as f64) as usize;
    if samples.len() > max {
        return Err(Error::InvalidRequest(format!(
            "audio: the clip is {:.2} s long; at most {MAX_SECONDS} s is accepted",
            samples.len() as f64 / SAMPLE_RATE as f64
        )));
    }
    Ok(samples)
}


/// What a request with audio needs from the model, off the engine thread: the frontend (the
/// checkpoint's extractor settings), the token rule and the clip limit.
#[derive(Clone)]
pub struct AudioSpec {
    pub frontend: std::sync::Arc<MelFrontend>,
    pub tokens: AudioTokens,
    pub max_clips: usize,
    /// Mel frames a clip must have for the tower (shorter clips are refused at submit).
    pub min_frames: usize,
}

impl AudioSpec {
    /// A clip's features, refused as an invalid request when the tower could not take them
    /// (too few frames).
    pub fn features(&self, samples: &[f32]) -> Result<MelFeatures> {
        let mel = self.frontend.features(samples)?;
        if mel.frames < self.min_frames {
            let need = self.frontend.min_samples(self.min_frames);
            return Err(Error::InvalidRequest(format!(
                "audio: the clip is too short: {} samples at {} Hz ({:.1} ms) make {} mel frame(s), the audio \
                 tower needs {} (at least {need} samples, {:.1} ms)",
                samples.len(),
                SAMPLE_RATE,
                samples.len() as f64 * 1000.0 / SAMPLE_RATE as f64,
                mel.frames,
                self.min_frames,
                need as f64 * 1000.0 / SAMPLE_RATE as f64
            )));
        }
        Ok(mel)
    }
}

impl std::fmt::Debug for AudioSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AudioSpec").field("tokens", &self.tokens).field("max_clips", &self.max_clips).finish()
    }
}

/// A model's audio tower (with its embedder), as the engine runs it at admission.
pub trait AudioTower: Send {
    fn spec(&self) -> &AudioSpec;
    /// One clip's log-mel features -> `[soft_tokens, hidden]`: the rows its audio positions
    /// take, in order (the reference's wrap-around included), ready to splice.
    fn encode(&self, mel: &MelFeatures, soft_tokens: usize) -> Result<mlx_rs::Array>;
}

/// A content hash of 16 kHz samples (FNV-1a over the f32 bits): prompt-cache keys put it in
/// place of a clip's audio positions, so two clips never share cached KV.
pub fn samples_hash(samples: &[f32]) -> u64 {
    crate::vision::pixels_hash(samples)
}
