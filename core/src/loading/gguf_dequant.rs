//! Host-side dequantization of GGUF tensors to float32, for block types MLX's GGUF reader does
//! not take (K-quants, Q5_0). The arithmetic is gguf-py's reference `dequantize` operation for
//! operation in float32 (no fused multiply-adds), so the result equals it bit for bit.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use mlx_rs::Array;

use crate::gguf::{GgmlType, GgufHeader, GgufTensorInfo};
use crate::{Error, Result};

const QK_K: usize = 256;

/// (elements, bytes) per block of the types this module reads.
pub fn block_layout(t: GgmlType) -> Option<(usize, usize)> {
    Some(match t {
        GgmlType::F32 => (1, 4),
        GgmlType::F16 => (1, 2),
        GgmlType::Q4_0 => (32, 18),
        GgmlType::Q4_1 => (32, 20),
        GgmlType::Q5_0 => (32, 22),
        GgmlType::Q8_0 => (32, 34),
        GgmlType::Q4_K => (QK_K, 144),
        GgmlType::Q5_K => (QK_K, 176),
        GgmlType::Q6_K => (QK_K, 210),
        _ => return None,
    })
}

/// IEEE half → single (exact).
fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h >> 15) as u32) << 31;
    let exp = ((h >> 10) & 0x1f) as u32;
    let mant = (h & 0x3ff) as u32;
    let bits = match (exp, mant) {
        (0, 0) => sign,
        (0, m) => {
            // Subnormal: normalize.
            let mut e = 127 - 15 + 1;
            let mut m = m;
            while m & 0x400 == 0 {
                m <<= 1;
                e -= 1;
            }
            sign | ((e as u32) << 23) | ((m & 0x3ff) << 13)
        }
        (0x1f, m) => sign | 0x7f80_0000 | (m << 13),
        (e, m) => sign | ((e + 127 - 15) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

fn half(b: &[u8]) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[0], b[1]]))
}

/// Q4_K / Q5_K 6-bit sub-block scales and mins (gguf-py `Q4_K.get_scale_min`).
fn scale_min_k4(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (d, m, md) = (&s[0..4], &s[4..8], &s[8..12]);
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for i in 0..4 {
        sc[i] = d[i] & 0x3f;
        sc[4 + i] = (md[i] & 0x0f) | ((d[i] >> 2) & 0x30);
        mn[i] = m[i] & 0x3f;
        mn[4 + i] = (md[i] >> 4) | ((m[i] >> 2) & 0x30);
    }
    (sc, mn)
}

fn dequantize_block(t: GgmlType, b: &[u8], out: &mut Vec<f32>) {
    match t {
        GgmlType::F32 => out.push(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        GgmlType::F16 => out.push(half(b)),
        GgmlType::Q8_0 => {
            let d = half(b);
            out.extend(b[2..34].iter().map(|&q| d * (q as i8) as f32));
        }
        GgmlType::Q4_0 => {
            let d = half(b);
            let qs = &b[2..18];
            out.extend(qs.iter().map(|&q| d * ((q & 0x0f) as i8 - 8) as f32));
            out.extend(qs.iter().map(|&q| d * ((q >> 4) as i8 - 8) as f32));
        }
        GgmlType::Q4_1 => {
            let (d, m) = (half(b), half(&b[2..]));
            let qs = &b[4..20];
            out.extend(qs.iter().map(|&q| d * (q & 0x0f) as f32 + m));
            out.extend(qs.iter().map(|&q| d * (q >> 4) as f32 + m));
        }
        GgmlType::Q5_0 => {
            let d = half(b);
            let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
            let qs = &b[6..22];
            for i in 0..32 {
                let lo = if i < 16 { qs[i] & 0x0f } else { qs[i - 16] >> 4 };
                let hi = ((qh >> i) & 1) as u8;
                out.push(d * (((lo | (hi << 4)) as i8) - 16) as f32);
            }
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let (d, dmin) = (half(b), half(&b[2..]));
            let (sc, mn) = scale_min_k4(&b[4..16]);
            let (qh, qs) = if t == GgmlType::Q5_K { (Some(&b[16..48]), &b[48..176]) } else { (None, &b[16..144]) };
            for k in 0..8 {
                let ds = d * sc[k] as f32;
                let dm = dmin * mn[k] as f32;
                let (c, s) = (k / 2, (k % 2) * 4);
                for j in 0..32 {
                    let mut q = (qs[32 * c + j] >> s) & 0x0f;
                    if let Some(qh) = qh {
                        q |= ((qh[j] >> k) & 1) << 4;
                    }
                    out.push(ds * q as f32 - dm);
                }
            }
        }
        GgmlType::Q6_K => {
            let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
            let d = half(&b[208..210]);
            let mut q = [0i8; QK_K];
            for h in 0..2 {
                for s in 0..2 {
                    for j in 0..64 {
                        q[h * 128 + s * 64 + j] = ((ql[64 * h + j] >> (4 * s)) & 0x0f) as i8;
                    }
                }
                for s in 0..4 {
                    for j in 0..32 {
                        q[h * 128 + s * 32 + j] |= (((qh[32 * h + j] >> (2 * s)) & 0x03) << 4) as i8;
                    }
                }
            }
            for (i, q) in q.iter().enumerate() {
                let ds = d * (scales[i / 16] as i8) as f32;
                out.push(ds * (q - 32) as f32);
            }
        }
        _ => unreachable!("block_layout filters the types"),
    }
}

/// Reads tensor `t` from the file and dequantizes it into a float32 array of its row-major
/// shape (GGUF dims reversed).
pub fn read_f32(file: &mut std::fs::File, path: &Path, h: &GgufHeader, t: &GgufTensorInfo) -> Result<Array> {
    let ty = t.ggml_type();
    let (block, block_bytes) = block_layout(ty)
        .ok_or_else(|| Error::Unsupported(format!("GGUF tensor '{}' has type {}, which Weft cannot dequantize", t.name, ty)))?;
    let n: u64 = t.dims.iter().product();
    let row = t.dims.first().copied().unwrap_or(1) as usize;
    if row % block != 0 {
        return Err(Error::ModelLoad(format!("GGUF tensor '{}' ({ty}): rows of {row} are not whole blocks", t.name)));
    }
    let bytes = (n as usize / block) * block_bytes;
    let mut raw = vec![0u8; bytes];
    file.seek(SeekFrom::Start(h.data_offset + t.offset)).map_err(|e| Error::io(path, e))?;
    file.read_exact(&mut raw).map_err(|e| Error::io(path, e))?;
    let mut out = Vec::with_capacity(n as usize);
    for b in raw.chunks_exact(block_bytes) {
        dequantize_block(ty, b, &mut out);
    }
    let shape: Vec<i32> = t.dims.iter().rev().map(|&d| d as i32).collect();
    Ok(Array::from_slice(&out, &shape))
}

#[cfg(test)]
mod tests {
    use super::f16_to_f32;

    #[test]
    fn half_conversion_is_exact() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert_eq!(f16_to_f32(0x8000).to_bits(), (-0.0f32).to_bits());
    }
}
