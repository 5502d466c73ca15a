//! GGUF block types that are MLX affine quantization in disguise, repacked without loss.
//!
//! MLX's affine format stores, per group of `group_size` consecutive elements of a row, a float
//! scale and bias and `bits`-bit codes: `w = scale * q + bias`. Every GGUF type below has groups
//! of 32 elements with one (scale, offset) pair, so it maps onto group size 32 exactly:
//!
//! | GGUF | element | MLX bits | scale | bias |
//! |---|---|---|---|---|
//! | Q4_0 | `d * (q - 8)` | 4 | d | -8 d |
//! | Q4_1 | `d * q + m` | 4 | d | m |
//! | Q5_0 | `d * (q - 16)` | 5 | d | -16 d |
//! | Q5_1 | `d * q + m` | 5 | d | m |
//! | Q8_0 | `d * q` (q signed) | 8 | d | -128 d (q + 128 stored) |
//! | Q4_K | `d * sc * q - dmin * mn` per 32-element sub-block | 4 | d sc | -dmin mn |
//! | Q5_K | as Q4_K with a fifth bit | 5 | d sc | -dmin mn |
//!
//! The products are exact in float32 (an fp16 times a small integer), so `scale * q + bias`
//! gives the very float32 values [`super::gguf_dequant`] (gguf-py's reference) produces (up to
//! the sign of a zero).
//! Q6_K (16-element sub-blocks with their own scales; MLX's smallest group is 32) has no
//! lossless affine form: [`requantize_q6_k`] rounds it to 8-bit group 32 (lossy, for the fast
//! CPU kernels; the error bound is stated there). Other types are expanded to float32.
//!
//! 5-bit types stay 5-bit in both CPU modes: Weft's fast kernels read 4-, 5- and 8-bit codes.
//!
//! Codes are packed the way MLX packs them: each row's codes as one little-endian bit stream of
//! `bits`-bit fields in u32 words (for 3/5/6 bits too; checked against `mx.quantize`).

use super::gguf_dequant::{half_at, k_scales_mins, nibbles, q6_k};
use crate::gguf::GgmlType;
use crate::{Error, Result};

/// The MLX group size every repacked type uses.
pub const GROUP_SIZE: usize = 32;

/// One tensor in MLX's affine layout: `rows × cols` elements.
pub struct Affine {
    pub bits: u32,
    /// `rows × cols * bits / 32` words.
    pub packed: Vec<u32>,
    /// `rows × cols / 32` each.
    pub scales: Vec<f32>,
    pub biases: Vec<f32>,
}

/// The MLX bit width `t` repacks to, if it has a lossless affine form.
pub fn affine_bits(t: GgmlType) -> Option<u32> {
    match t {
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q4_K => Some(4),
        GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q5_K => Some(5),
        GgmlType::Q8_0 => Some(8),
        _ => None,
    }
}

/// Repacks `data` (blocks of type `t`, a row-major tensor with rows of `cols` elements).
pub fn repack(t: GgmlType, data: &[u8], cols: usize) -> Result<Affine> {
    let bits = affine_bits(t).ok_or_else(|| Error::Unsupported(format!("GGUF type {t} has no affine form")))?;
    let (block, block_bytes) = super::gguf_dequant::block_geometry(t).expect("affine types have a geometry");
    if cols % block != 0 || data.len() % block_bytes != 0 {
        return Err(Error::ModelLoad(format!("GGUF {t} rows of {cols} elements do not hold whole blocks")));
    }
    let n = data.len() / block_bytes * block;
    let groups = n / GROUP_SIZE;
    let mut codes = Vec::with_capacity(n);
    let mut scales = Vec::with_capacity(groups);
    let mut biases = Vec::with_capacity(groups);
    for b in data.chunks_exact(block_bytes) {
        match t {
            GgmlType::Q4_0 => {
                let d = half_at(b, 0);
                scales.push(d);
                biases.push(-8.0 * d);
                codes.extend(nibbles(&b[2..18]));
            }
            GgmlType::Q4_1 => {
                scales.push(half_at(b, 0));
                biases.push(half_at(b, 2));
                codes.extend(nibbles(&b[4..20]));
            }
            GgmlType::Q5_0 => {
                let d = half_at(b, 0);
                scales.push(d);
                biases.push(-16.0 * d);
                codes.extend(with_high_bits(&b[6..22], &b[2..6]));
            }
            GgmlType::Q5_1 => {
                scales.push(half_at(b, 0));
                biases.push(half_at(b, 2));
                codes.extend(with_high_bits(&b[8..24], &b[4..8]));
            }
            GgmlType::Q8_0 => {
                let d = half_at(b, 0);
                scales.push(d);
                biases.push(-128.0 * d);
                codes.extend(b[2..34].iter().map(|&q| (q as i8 as i32 + 128) as u8));
            }
            GgmlType::Q4_K | GgmlType::Q5_K => {
                let (d, dmin) = (half_at(b, 0), half_at(b, 2));
                let (sc, mn) = k_scales_mins(&b[4..16]);
                let (qh, qs) = if t == GgmlType::Q5_K { (Some(&b[16..48]), &b[48..176]) } else { (None, &b[16..144]) };
                for sub in 0..8 {
                    scales.push(d * sc[sub] as f32);
                    biases.push(-(dmin * mn[sub] as f32));
                    let chunk = &qs[(sub / 2) * 32..(sub / 2) * 32 + 32];
                    let shift = (sub % 2) * 4;
                    codes.extend(chunk.iter().enumerate().map(|(i, q)| {
                        let hi = qh.map_or(0, |qh| ((qh[i] >> sub) & 1) << 4);
                        ((q >> shift) & 0x0F) | hi
                    }));
                }
            }
            _ => unreachable!("affine_bits admitted {t}"),
        }
    }
    Ok(Affine { bits, packed: pack(&codes, bits, cols), scales, biases })
}

/// Q6_K as MLX 8-bit group 32, lossy. A 32-element group spans two 16-element Q6_K sub-blocks
/// with scales `s1`, `s2`; where `s1 == s2` the group is `s * q - 32 s` with the file's 6-bit
/// codes (exact). Otherwise the group's 32 reference values (gguf-py's float32 expansion) are
/// rounded to the 256-level grid from their minimum to their maximum: every element moves by at
/// most `(max - min) / 510`, at most 64/510 (about 1/8) of the file's own quantization step in
/// the sub-block with the larger scale (the group's range is at most 64 of those steps).
pub fn requantize_q6_k(data: &[u8], cols: usize) -> Result<Affine> {
    const BLOCK: usize = 256;
    const BLOCK_BYTES: usize = 210;
    if cols % BLOCK != 0 || data.len() % BLOCK_BYTES != 0 {
        return Err(Error::ModelLoad(format!("GGUF Q6_K rows of {cols} elements do not hold whole blocks")));
    }
    let n = data.len() / BLOCK_BYTES * BLOCK;
    let mut codes = Vec::with_capacity(n);
    let mut scales = Vec::with_capacity(n / GROUP_SIZE);
    let mut biases = Vec::with_capacity(n / GROUP_SIZE);
    let mut values = Vec::with_capacity(BLOCK);
    for b in data.chunks_exact(BLOCK_BYTES) {
        values.clear();
        q6_k(b, &mut values);
        let d = half_at(b, 208);
        for (g, group) in values.chunks_exact(GROUP_SIZE).enumerate() {
            let (s1, s2) = (b[192 + 2 * g] as i8, b[192 + 2 * g + 1] as i8);
            if s1 == s2 {
                // v = s (q - 32) with s = d * sc: s * q, 32 s and their difference are exact in
                // float32 (at most 24 significant bits), so MLX's `scale * q + bias` is v.
                let s = d * s1 as f32;
                scales.push(s);
                biases.push(-32.0 * s);
                codes.extend(q6_codes(b, g));
                continue;
            }
            let lo = group.iter().copied().fold(f32::INFINITY, f32::min);
            let hi = group.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let step = (hi - lo) / 255.0;
            scales.push(step);
            biases.push(lo);
            codes.extend(group.iter().map(|&v| if step > 0.0 { ((v - lo) / step).round().clamp(0.0, 255.0) as u8 } else { 0 }));
        }
    }
    Ok(Affine { bits: 8, packed: pack(&codes, 8, cols), scales, biases })
}

/// The unsigned 6-bit codes (0..64, value = scale * (q - 32)) of elements `32 g .. 32 g + 32` of
/// a Q6_K block: low 4 bits in `ql`, high 2 bits in `qh` (the layout `gguf_dequant` expands).
fn q6_codes(b: &[u8], g: usize) -> impl Iterator<Item = u8> + '_ {
    let (ql, qh) = (&b[..128], &b[128..192]);
    (g * GROUP_SIZE..(g + 1) * GROUP_SIZE).map(move |i| {
        let (half, j) = (i / 128, i % 128);
        let lo = (ql[half * 64 + j % 64] >> ((j / 64) * 4)) & 0x0F;
        let hi = (qh[half * 32 + j % 32] >> ((j / 32) * 2)) & 0x03;
        lo | (hi << 4)
    })
}

/// Q5_0 / Q5_1 codes: the nibbles plus bit i of the little-endian u32 `qh` as bit 4 of element i.
fn with_high_bits<'a>(qs: &'a [u8], qh: &[u8]) -> impl Iterator<Item = u8> + 'a {
    let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    nibbles(qs).enumerate().map(move |(i, lo)| lo | ((((qh >> i) & 1) as u8) << 4))
}

/// Each row's codes as a little-endian stream of `bits`-bit fields in u32 words (a row of
/// `cols` codes fills `cols * bits / 32` words exactly, since `cols` is a multiple of 32).
fn pack(codes: &[u8], bits: u32, cols: usize) -> Vec<u32> {
    let words_per_row = cols * bits as usize / 32;
    let mut out = Vec::with_capacity(codes.len() / cols * words_per_row);
    for row in codes.chunks_exact(cols) {
        let (mut acc, mut filled) = (0u64, 0u32);
        for &q in row {
            acc |= (q as u64) << filled;
            filled += bits;
            if filled >= 32 {
                out.push(acc as u32);
                acc >>= 32;
                filled -= 32;
            }
        }
        debug_assert_eq!(filled, 0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// MLX's dequantization of the repacked form, written out.
    fn dequantize(a: &Affine, cols: usize) -> Vec<f32> {
        let bits = a.bits as usize;
        let mut out = Vec::new();
        for (r, row) in a.packed.chunks_exact(cols * bits / 32).enumerate() {
            for c in 0..cols {
                let bit = c * bits;
                let word = (row[bit / 32] as u64) | ((row.get(bit / 32 + 1).copied().unwrap_or(0) as u64) << 32);
                let q = ((word >> (bit % 32)) & ((1 << bits) - 1)) as f32;
                let g = r * cols / GROUP_SIZE + c / GROUP_SIZE;
                out.push(a.scales[g] * q + a.biases[g]);
            }
        }
        out
    }

    #[test]
    fn repacked_blocks_dequantize_to_the_reference_values() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../goldens/gguf/dequant");
        for (name, t) in [
            ("Q4_0", GgmlType::Q4_0),
            ("Q4_1", GgmlType::Q4_1),
            ("Q5_0", GgmlType::Q5_0),
            ("Q5_1", GgmlType::Q5_1),
            ("Q8_0", GgmlType::Q8_0),
            ("Q4_K", GgmlType::Q4_K),
            ("Q5_K", GgmlType::Q5_K),
        ] {
            let data = std::fs::read(dir.join(format!("{name}.bin"))).unwrap();
            let want: Vec<f32> = std::fs::read(dir.join(format!("{name}.f32")))
                .unwrap()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            let cols = 256;
            assert_eq!(want.len() % cols, 0, "{name}");
            let a = repack(t, &data, cols).unwrap();
            assert_eq!(a.bits, affine_bits(t).unwrap());
            let got = dequantize(&a, cols);
            assert_eq!(got.len(), want.len(), "{name}");
            // Equal as numbers: a zero can come out as +0 where gguf-py's `d * 0` gives -0.
            let differing = got.iter().zip(&want).filter(|(g, w)| g != w).count();
            assert_eq!(differing, 0, "{name}: {differing} of {} values differ", want.len());
        }
    }

    #[test]
    fn q6_k_requantized_to_8_bits_stays_within_its_bound() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../goldens/gguf/dequant");
        let data = std::fs::read(dir.join("Q6_K.bin")).unwrap();
        let want: Vec<f32> = std::fs::read(dir.join("Q6_K.f32"))
            .unwrap()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let cols = 256;
        let a = requantize_q6_k(&data, cols).unwrap();
        assert_eq!(a.bits, 8);
        let got = dequantize(&a, cols);
        assert_eq!(got.len(), want.len());
        let (mut max_err, mut sum_err, mut max_rel) = (0.0f64, 0.0f64, 0.0f64);
        for (g, (got, want)) in got.chunks_exact(GROUP_SIZE).zip(want.chunks_exact(GROUP_SIZE)).enumerate() {
            let lo = want.iter().copied().fold(f32::INFINITY, f32::min) as f64;
            let hi = want.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            for (x, y) in got.iter().zip(want) {
                let e = (*x as f64 - *y as f64).abs();
                // Half a step of the 8-bit grid, plus float32 rounding of scale * q + bias.
                assert!(e <= (hi - lo) / 510.0 * 1.0001 + 1e-7 * hi.abs().max(lo.abs()), "group {g}: error {e}");
                max_err = max_err.max(e);
                sum_err += e;
                if hi > lo {
                    max_rel = max_rel.max(e / (hi - lo));
                }
            }
        }
        let mean = sum_err / want.len() as f64;
        // The blocks hold real errors, not a silently exact copy: rounding happened somewhere.
        assert!(max_err > 0.0);
        eprintln!("Q6_K -> 8-bit g32: max |error| {max_err:.3e}, mean {mean:.3e}, max error / group range {max_rel:.4}");
    }

    #[test]
    fn q6_k_groups_with_one_scale_repack_exactly() {
        // A block whose sixteen sub-block scales are all 3: every group takes the exact form.
        let mut block = vec![0u8; 210];
        for (i, b) in block[..192].iter_mut().enumerate() {
            *b = (i * 37 % 251) as u8;
        }
        block[192..208].fill(3);
        block[208..210].copy_from_slice(&half::f16::from_f32(0.0123).to_le_bytes());
        let mut want = Vec::new();
        q6_k(&block, &mut want);
        let got = dequantize(&requantize_q6_k(&block, 256).unwrap(), 256);
        assert_eq!(got, want);
    }

    #[test]
    fn packing_is_a_little_endian_bit_stream() {
        let codes: Vec<u8> = (0..32).map(|i| (i * 7 % 32) as u8).collect();
        let words = pack(&codes, 5, 32);
        assert_eq!(words.len(), 5);
        let bit = |k: usize| (words[k / 32] >> (k % 32)) & 1;
        for (i, &q) in codes.iter().enumerate() {
            let got = (0..5).map(|j| bit(5 * i + j) << j).sum::<u32>();
            assert_eq!(got as u8, q, "code {i}");
        }
    }
}
