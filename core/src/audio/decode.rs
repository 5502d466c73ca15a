//! Compressed or PCM audio bytes -> mono f32 samples at the source rate, with symphonia.
//!
//! The reference (mlx-vlm's `load_audio`, through mlx-audio's miniaudio reader) reads float32
//! samples (PCM16 as `s / 32768`, which symphonia also does) and downmixes with
//! `audio.mean(axis=1)` in float32: a left-to-right sum over the channels, then `/ channels`.

use std::io::Cursor;

use symphonia::core::audio::SampleBuffer;
use symphonia::core::codecs::{DecoderOptions, CODEC_TYPE_NULL};
use symphonia::core::errors::Error as SymphoniaError;
use symphonia::core::formats::FormatOptions;
use symphonia::core::io::MediaSourceStream;
use symphonia::core::meta::MetadataOptions;
use symphonia::core::probe::Hint;

use crate::{Error, Result};

/// Decoded audio, downmixed to one channel.
#[derive(Debug, Clone)]
pub struct MonoAudio {
    pub samples: Vec<f32>,
    pub sample_rate: u32,
    /// Channels in the source (before the downmix).
    pub source_channels: usize,
}

impl MonoAudio {
    pub fn seconds(&self) -> f64 {
        self.samples.len() as f64 / self.sample_rate as f64
    }
}

fn bad(msg: impl std::fmt::Display) -> Error {
    Error::InvalidRequest(format!("audio: {msg}"))
}

/// Decodes WAV, MP3, FLAC or Ogg Vorbis `bytes` (the container is detected from the bytes;
/// `format_hint` such as "wav" or "mp3" only helps the probe) and downmixes to mono.
/// Decoding stops with an error once the source runs past `max_seconds`, so an over-long clip
/// costs no more than the limit.
pub fn decode_mono(bytes: &[u8], format_hint: Option<&str>, max_seconds: f64) -> Result<MonoAudio> {
    if bytes.is_empty() {
        return Err(bad("the audio data is empty"));
    }
    let mss = MediaSourceStream::new(Box::new(Cursor::new(bytes.to_vec())), Default::default());
    let mut hint = Hint::new();
    if let Some(ext) = format_hint {
        hint.with_extension(ext);
    }
    let probed = symphonia::default::get_probe()
        .format(&hint, mss, &FormatOptions::default(), &MetadataOptions::default())
        .map_err(|e| bad(format!("unsupported or unreadable format ({e}); supported: WAV, MP3, FLAC, Ogg Vorbis")))?;
    let mut format = probed.format;
    let track = format
        .tracks()
        .iter()
        .find(|t| t.codec_params.codec != CODEC_TYPE_NULL)
        .ok_or_else(|| bad("no audio track in the data"))?;
    let track_id = track.id;
    let mut decoder = symphonia::default::get_codecs()
        .make(&track.codec_params, &DecoderOptions::default())
        .map_err(|e| bad(format!("unsupported codec ({e}); supported: PCM, MP3, FLAC, Vorbis")))?;

    let mut samples = Vec::new();
    let mut rate = track.codec_params.sample_rate;
    let mut channels = track.codec_params.channels.map(|c| c.count());
    let mut interleaved: Option<SampleBuffer<f32>> = None;
    loop {
        let packet = match format.next_packet() {
            Ok(p) => p,
            Err(SymphoniaError::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(SymphoniaError::ResetRequired) => break,
            Err(e) => return Err(bad(format!("reading the stream: {e}"))),
        };
        if packet.track_id() != track_id {
            continue;
        }
        let decoded = match decoder.decode(&packet) {
            Ok(d) => d,
            // A corrupt frame: skipped, as decoders (and miniaudio) do.
            Err(SymphoniaError::DecodeError(_)) => continue,
            Err(e) => return Err(bad(format!("decoding: {e}"))),
        };
        let spec = *decoded.spec();
        let n_ch = spec.channels.count();
        if n_ch == 0 {
            return Err(bad("the stream has no channels"));
        }
        if channels.is_some_and(|c| c != n_ch) && !samples.is_empty() {
            return Err(bad("the channel count changes inside the stream"));
        }
        channels = Some(n_ch);
        rate = Some(spec.rate);
        let buf = match &mut interleaved {
            Some(b) if b.capacity() >= decoded.capacity() * n_ch => b,
            _ => interleaved.insert(SampleBuffer::new(decoded.capacity() as u64, spec)),
        };
        buf.copy_interleaved_ref(decoded);
        for frame in buf.samples().chunks_exact(n_ch) {
            let mut sum = 0f32;
            for &s in frame {
                sum += s;
            }
            samples.push(sum / n_ch as f32);
        }
        if samples.len() as f64 > max_seconds * spec.rate as f64 {
            return Err(bad(format!("the clip is longer than the {max_seconds} s limit")));
        }
    }
    let sample_rate = rate.ok_or_else(|| bad("the stream has no sample rate"))?;
    if sample_rate == 0 {
        return Err(bad("the stream's sample rate is 0"));
    }
    if samples.is_empty() {
        return Err(bad("the clip has no samples"));
    }
    Ok(MonoAudio { samples, sample_rate, source_channels: channels.unwrap_or(1) })
}
