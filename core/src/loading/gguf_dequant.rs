//! Dequantization of GGUF tensor types MLX cannot read itself (its reader handles F32, F16,
//! Q4_0, Q4_1 and Q8_0). Each block type is expanded to float32 with the same float32
//! operations, in the same order, as gguf-py's reference (`gguf.quants`), so weights match the
//! oracle's conversion bit for bit.

use half::{bf16, f16};

use crate::gguf::GgmlType;
use crate::{Error, Result};

const QK_K: usize = 256;

/// (elements, bytes) of one block of `t`, for the types this module expands.
pub fn block_geometry(t: GgmlType) -> Option<(usize, usize)> {
    Some(match t {
        GgmlType::F32 => (1, 4),
        GgmlType::F16 | GgmlType::BF16 => (1, 2),
        GgmlType::Q4_0 => (32, 18),
        GgmlType::Q4_1 => (32, 20),
        GgmlType::Q5_0 => (32, 22),
        GgmlType::Q5_1 => (32, 24),
        GgmlType::Q8_0 => (32, 34),
        GgmlType::Q4_K => (QK_K, 144),
        GgmlType::Q5_K => (QK_K, 176),
        GgmlType::Q6_K => (QK_K, 210),
        _ => return None,
    })
}

pub(super) fn half_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Expands `n` elements of type `t` stored in `data` to float32.
pub fn dequantize(t: GgmlType, data: &[u8], n: usize) -> Result<Vec<f32>> {
    let (block, block_bytes) =
        block_geometry(t).ok_or_else(|| Error::Unsupported(format!("dequantizing GGUF type {t}")))?;
    if n % block != 0 || data.len() != n / block * block_bytes {
        return Err(Error::ModelLoad(format!(
            "GGUF {t} data of {} bytes does not hold {n} elements in {block}-element blocks",
            data.len()
        )));
    }
    let mut out = Vec::with_capacity(n);
    let blocks = data.chunks_exact(block_bytes);
    match t {
        GgmlType::F32 => out.extend(data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
        GgmlType::F16 => out.extend(data.chunks_exact(2).map(|b| half_at(b, 0))),
        GgmlType::BF16 => out.extend(data.chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())),
        GgmlType::Q4_0 => blocks.for_each(|b| q4_0(b, &mut out)),
        GgmlType::Q4_1 => blocks.for_each(|b| q4_1(b, &mut out)),
        GgmlType::Q5_0 => blocks.for_each(|b| q5_0(b, &mut out)),
        GgmlType::Q5_1 => blocks.for_each(|b| q5_1(b, &mut out)),
        GgmlType::Q8_0 => blocks.for_each(|b| q8_0(b, &mut out)),
        GgmlType::Q4_K => blocks.for_each(|b| q4_k(b, &mut out)),
        GgmlType::Q5_K => blocks.for_each(|b| q5_k(b, &mut out)),
        GgmlType::Q6_K => blocks.for_each(|b| q6_k(b, &mut out)),
        _ => unreachable!("block_geometry admitted {t}"),
    }
    Ok(out)
}

/// The 4-bit quants of a 32-element block: low nibbles are elements 0..16, high 16..32.
pub(super) fn nibbles(qs: &[u8]) -> impl Iterator<Item = u8> + '_ {
    qs.iter().map(|q| q & 0x0F).chain(qs.iter().map(|q| q >> 4))
}

fn q4_0(b: &[u8], out: &mut Vec<f32>) {
    let d = half_at(b, 0);
    out.extend(nibbles(&b[2..18]).map(|q| d * (q as i8 - 8) as f32));
}

fn q4_1(b: &[u8], out: &mut Vec<f32>) {
    let (d, m) = (half_at(b, 0), half_at(b, 2));
    out.extend(nibbles(&b[4..20]).map(|q| d * q as f32 + m));
}

/// The 5th bits of a 32-element block, one per element, from a little-endian u32.
fn high_bits(qh: &[u8]) -> u32 {
    u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]])
}

fn q5_0(b: &[u8], out: &mut Vec<f32>) {
    let d = half_at(b, 0);
    let qh = high_bits(&b[2..6]);
    out.extend(nibbles(&b[6..22]).enumerate().map(|(i, lo)| {
        let q = lo | ((((qh >> i) & 1) as u8) << 4);
        d * (q as i8 - 16) as f32
    }));
}

fn q5_1(b: &[u8], out: &mut Vec<f32>) {
    let (d, m) = (half_at(b, 0), half_at(b, 2));
    let qh = high_bits(&b[4..8]);
    out.extend(nibbles(&b[8..24]).enumerate().map(|(i, lo)| {
        let q = lo | ((((qh >> i) & 1) as u8) << 4);
        d * q as f32 + m
    }));
}

fn q8_0(b: &[u8], out: &mut Vec<f32>) {
    let d = half_at(b, 0);
    out.extend(b[2..34].iter().map(|&q| d * (q as i8) as f32));
}

/// The eight 6-bit (scale, min) pairs packed into 12 bytes of a Q4_K / Q5_K block.
pub(super) fn k_scales_mins(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut mn) = ([0u8; 8], [0u8; 8]);
    for j in 0..4 {
        sc[j] = s[j] & 0x3F;
        mn[j] = s[j + 4] & 0x3F;
        sc[j + 4] = (s[j + 8] & 0x0F) | ((s[j] >> 2) & 0x30);
        mn[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 2) & 0x30);
    }
    (sc, mn)
}

/// Q4_K: 8 sub-blocks of 32; 4-bit quants stored as 4 chunks of 32 bytes, each chunk holding
/// sub-block 2c in its low nibbles and 2c + 1 in its high nibbles.
fn q4_k(b: &[u8], out: &mut Vec<f32>) {
    let (d, dmin) = (half_at(b, 0), half_at(b, 2));
    let (sc, mn) = k_scales_mins(&b[4..16]);
    let qs = &b[16..144];
    for sub in 0..8 {
        let (scale, min) = (d * sc[sub] as f32, dmin * mn[sub] as f32);
        let chunk = &qs[(sub / 2) * 32..(sub / 2) * 32 + 32];
        let shift = (sub % 2) * 4;
        out.extend(chunk.iter().map(|q| scale * ((q >> shift) & 0x0F) as f32 - min));
    }
}

/// Q5_K: Q4_K's layout plus one high bit per element: bit `sub` of `qh[i]` for element i of
/// sub-block `sub`.
fn q5_k(b: &[u8], out: &mut Vec<f32>) {
    let (d, dmin) = (half_at(b, 0), half_at(b, 2));
    let (sc, mn) = k_scales_mins(&b[4..16]);
    let qh = &b[16..48];
    let qs = &b[48..176];
    for sub in 0..8 {
        let (scale, min) = (d * sc[sub] as f32, dmin * mn[sub] as f32);
        let chunk = &qs[(sub / 2) * 32..(sub / 2) * 32 + 32];
        let shift = (sub % 2) * 4;
        out.extend(chunk.iter().zip(qh).map(|(q, h)| {
            let q = ((q >> shift) & 0x0F) | (((h >> sub) & 1) << 4);
            scale * q as f32 - min
        }));
    }
}

/// Q6_K: 16 sub-blocks of 16 with int8 scales; low 4 bits in `ql` (2 chunks of 64 bytes, each
/// covering 128 elements as low then high nibbles), high 2 bits in `qh` (2 chunks of 32 bytes,
/// four 2-bit fields per byte).
pub(super) fn q6_k(b: &[u8], out: &mut Vec<f32>) {
    let (ql, qh, scales) = (&b[..128], &b[128..192], &b[192..208]);
    let d = half_at(b, 208);
    let start = out.len();
    out.resize(start + QK_K, 0.0);
    let block = &mut out[start..];
    for (i, value) in block.iter_mut().enumerate() {
        let half = i / 128; // which 128-element half
        let j = i % 128;
        let lo_chunk = &ql[half * 64..half * 64 + 64];
        let lo = (lo_chunk[j % 64] >> ((j / 64) * 4)) & 0x0F;
        let hi = (qh[half * 32 + j % 32] >> ((j / 32) * 2)) & 0x03;
        let q = (lo | (hi << 4)) as i8 - 32;
        let scale = d * (scales[i / 16] as i8) as f32;
        *value = scale * q as f32;
    }
}
