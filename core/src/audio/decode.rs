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

/// A sample rate outside [`super::MIN_SAMPLE_RATE`]..=[`super::MAX_SAMPLE_RATE`] is refused
/// before anything is sized from it (the resampler's filter and the decoded length both grow
/// with the rate).
pub(super) fn check_rate(rate: u32) -> Result<()> {
    let (lo, hi) = (super::MIN_SAMPLE_RATE, super::MAX_SAMPLE_RATE);
    if !(lo..=hi).contains(&rate) {
        return Err(bad(format!("the stream's sample rate is {rate} Hz; supported: {lo}..={hi} Hz")));
    }
    Ok(())
}

/// Checks a RIFF/WAVE header before symphonia sees it: symphonia 0.5 panics on a zero sample
/// rate or block size (`TimeBase::new`, a division), divides by header fields for ADPCM, and
/// allocates a LIST chunk's claimed length up front. So the chunks before `data` must lie
/// inside the bytes, and the `fmt ` chunk must have a supported encoding, 1..=32 channels, a
/// sample rate in range and a block size a frame of those channels can have. Bytes that are
/// not RIFF/WAVE pass through (the probe decides what they are).
fn check_wav_header(bytes: &[u8]) -> Result<()> {
    if bytes.len() < 12 || &bytes[0..4] != b"RIFF" || &bytes[8..12] != b"WAVE" {
        return Ok(());
    }
    let u16_at = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]);
    let u32_at = |at: usize| u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    let mut at = 12usize;
    while at + 8 <= bytes.len() {
        let id = &bytes[at..at + 4];
        let len = u32_at(at + 4) as usize;
        let body = at + 8;
        if id == b"data" {
            // Its length may run past the bytes (streamed WAVs): reading stops at the end.
            return Ok(());
        }
        if len > bytes.len() - body {
            return Err(bad(format!(
                "the WAV chunk {:?} claims {len} bytes but only {} follow",
                String::from_utf8_lossy(id),
                bytes.len() - body
            )));
        }
        if id == b"fmt " {
            if len < 16 {
                return Err(bad("the WAV format chunk is too short"));
            }
            let (tag, channels, rate) = (u16_at(body), u16_at(body + 2), u32_at(body + 4));
            let block_align = u16_at(body + 12);
            // PCM, IEEE float, A-law, mu-law, extensible (ADPCM has no decoder here).
            if !matches!(tag, 0x0001 | 0x0003 | 0x0006 | 0x0007 | 0xfffe) {
                return Err(bad(format!(
                    "unsupported WAV encoding (format tag {tag:#06x}); supported: PCM, IEEE float, A-law, mu-law"
                )));
            }
            if !(1..=32).contains(&channels) {
                return Err(bad(format!("the WAV header says {channels} channels; supported: 1..=32")));
            }
            check_rate(rate)?;
            if block_align == 0 || block_align > channels * 8 {
                return Err(bad(format!("the WAV header's block size {block_align} does not fit {channels} channel(s)")));
            }
        }
        at = body + len + (len & 1);
    }
    Ok(())
}

/// `v` grown by `n` more elements, or an error (not an abort) when memory runs out.
pub(super) fn reserve<T>(v: &mut Vec<T>, n: usize) -> Result<()> {
    v.try_reserve(n).map_err(|_| Error::Capacity(format!("audio: out of memory for {n} more samples")))
}

/// Decodes WAV, MP3, FLAC or Ogg Vorbis `bytes` (the container is detected from the bytes;
/// `format_hint` such as "wav" or "mp3" only helps the probe) and downmixes to mono.
/// Decoding stops with an error once the source runs past `max_seconds`, so an over-long clip
/// costs no more than the limit.
pub fn decode_mono(bytes: &[u8], format_hint: Option<&str>, max_seconds: f64) -> Result<MonoAudio> {
    if bytes.is_empty() {
        return Err(bad("the audio data is empty"));
    }
    check_wav_header(bytes)?;
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
    if let Some(rate) = track.codec_params.sample_rate {
        check_rate(rate)?;
    }
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
        check_rate(spec.rate)?;
        channels = Some(n_ch);
        rate = Some(spec.rate);
        let buf = match &mut interleaved {
            Some(b) if b.capacity() >= decoded.capacity() * n_ch => b,
            _ => interleaved.insert(SampleBuffer::new(decoded.capacity() as u64, spec)),
        };
        buf.copy_interleaved_ref(decoded);
        reserve(&mut samples, buf.samples().len() / n_ch)?;
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
    check_rate(sample_rate)?;
    if samples.is_empty() {
        return Err(bad("the clip has no samples"));
    }
    Ok(MonoAudio { samples, sample_rate, source_channels: channels.unwrap_or(1) })
}
