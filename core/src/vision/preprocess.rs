//! Image preprocessing as transformers' PIL image processors do it (the `use_fast=False`
//! processors mlx-vlm loads): decode, convert to RGB (alpha composited onto white, as
//! `convert_to_rgb` does), resize with Pillow's resampling (reimplemented here: the `image`
//! crate's filters give other pixels), `x / 255` in f64 then f32, `(x - mean) / std` in f32.
//! PNG and WebP (lossless) decode to the same pixels as Pillow; JPEG decoders may differ from
//! Pillow's libjpeg-turbo by a few levels, so JPEG pixel values are close, not bit-equal.

use crate::{Error, Result};

/// Resampling filters (Pillow's `Image.Resampling`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resample {
    Bilinear,
    Bicubic,
}

impl Resample {
    /// PIL's integer codes (2 bilinear, 3 bicubic), as processor configs store them.
    pub fn from_pil(code: i64) -> Result<Resample> {
        match code {
            2 => Ok(Resample::Bilinear),
            3 => Ok(Resample::Bicubic),
            other => Err(Error::Unsupported(format!("image resample filter {other} (only 2 bilinear, 3 bicubic)"))),
        }
    }

    fn support(self) -> f64 {
        match self {
            Resample::Bilinear => 1.0,
            Resample::Bicubic => 2.0,
        }
    }

    fn weight(self, x: f64) -> f64 {
        let x = x.abs();
        match self {
            Resample::Bilinear => (1.0 - x).max(0.0),
            Resample::Bicubic => {
                let a = -0.5;
                if x < 1.0 {
                    ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
                } else if x < 2.0 {
                    (((x - 5.0) * x + 8.0) * x - 4.0) * a
                } else {
                    0.0
                }
            }
        }
    }
}

/// How a model's processor turns an image into pixel values.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageProcessor {
    /// The output size ([`Sizing::Fixed`]).
    pub height: usize,
    pub width: usize,
    pub resample: Resample,
    pub rescale_factor: f64,
    pub mean: [f32; 3],
    pub std: [f32; 3],
    pub sizing: Sizing,
    /// Gemma 3's pan-and-scan (extra crops of a wide or tall image), when the checkpoint's
    /// processor config turns it on ([`Sizing::Fixed`] only).
    pub pan_and_scan: Option<PanAndScan>,
}

/// transformers' Gemma3ImageProcessor `pan_and_scan` settings (defaults: Gemma3Processor's
/// `images_kwargs`, used where the config leaves a field null).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PanAndScan {
    pub min_crop_size: usize,
    pub max_num_crops: usize,
    pub min_ratio_to_activate: f64,
}

impl Default for PanAndScan {
    fn default() -> Self {
        PanAndScan { min_crop_size: 256, max_num_crops: 4, min_ratio_to_activate: 1.2 }
    }
}

impl PanAndScan {
    /// `Some` when an image processor config (`preprocessor_config.json`, or the
    /// `image_processor` object of `processor_config.json`) sets `do_pan_and_scan: true`.
    pub fn from_config(v: &serde_json::Value) -> Result<Option<PanAndScan>> {
        let v = v.get("image_processor").unwrap_or(v);
        if v.get("do_pan_and_scan").and_then(|x| x.as_bool()) != Some(true) {
            return Ok(None);
        }
        let d = PanAndScan::default();
        let int = |k: &str, default: usize| -> Result<usize> {
            match v.get(k) {
                None | Some(serde_json::Value::Null) => Ok(default),
                Some(x) => x
                    .as_u64()
                    .filter(|&n| n > 0)
                    .map(|n| n as usize)
                    .ok_or_else(|| Error::ModelLoad(format!("image processor config: {k} must be a positive integer"))),
            }
        };
        let ratio = match v.get("pan_and_scan_min_ratio_to_activate") {
            None | Some(serde_json::Value::Null) => d.min_ratio_to_activate,
            Some(x) => x.as_f64().ok_or_else(|| {
                Error::ModelLoad("image processor config: pan_and_scan_min_ratio_to_activate must be a number".into())
            })?,
        };
        Ok(Some(PanAndScan {
            min_crop_size: int("pan_and_scan_min_crop_size", d.min_crop_size)?,
            max_num_crops: int("pan_and_scan_max_num_crops", d.max_num_crops)?,
            min_ratio_to_activate: ratio,
        }))
    }

    /// The crops of `img` (none when its aspect ratio is below the threshold or the crops
    /// would be smaller than `min_crop_size`), left to right / top to bottom, as
    /// transformers' `pan_and_scan` cuts them (the last crop may be narrower: numpy slices
    /// stop at the edge).
    pub fn crops(&self, img: &Rgb8) -> Vec<Rgb8> {
        let (w, h) = (img.width, img.height);
        let (nw, nh) = if w >= h {
            if (w as f64 / h as f64) < self.min_ratio_to_activate {
                return Vec::new();
            }
            let n = ((w as f64 / h as f64 + 0.5).floor() as usize).min(w / self.min_crop_size);
            (n.max(2).min(self.max_num_crops), 1)
        } else {
            if (h as f64 / w as f64) < self.min_ratio_to_activate {
                return Vec::new();
            }
            let n = ((h as f64 / w as f64 + 0.5).floor() as usize).min(h / self.min_crop_size);
            (1, n.max(2).min(self.max_num_crops))
        };
        let (cw, ch) = (w.div_ceil(nw), h.div_ceil(nh));
        if cw.min(ch) < self.min_crop_size {
            return Vec::new();
        }
        let mut out = Vec::with_capacity(nw * nh);
        for y0 in (0..nh).map(|i| i * ch) {
            for x0 in (0..nw).map(|i| i * cw) {
                let (x1, y1) = ((x0 + cw).min(w), (y0 + ch).min(h));
                if x0 >= x1 || y0 >= y1 {
                    // numpy gives an empty crop here, which the resize would then refuse.
                    continue;
                }
                let mut data = Vec::with_capacity((x1 - x0) * (y1 - y0) * 3);
                for y in y0..y1 {
                    data.extend_from_slice(&img.data[(y * w + x0) * 3..(y * w + x1) * 3]);
                }
                out.push(Rgb8 { width: x1 - x0, height: y1 - y0, data });
            }
        }
        out
    }
}

/// The two processor families the towers here use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sizing {
    /// transformers' Gemma3ImageProcessorPil: alpha composited onto white, resized to
    /// `height x width`, `x * rescale` in f64 then f32, `(x - mean) / std`.
    Fixed,
    /// mlx-vlm's Gemma4ImageProcessor: PIL `convert("RGB")` (alpha dropped), an
    /// aspect-ratio-preserving resize to the largest size with at most `max_patches` patches
    /// of `patch` pixels and both sides multiples of `pooling * patch` (none when already that
    /// size), `x * rescale` in f32, no normalisation.
    PatchBudget { patch: usize, max_patches: usize, pooling: usize },
}

/// Preprocessed pixel values `[height, width, 3]` (channels last).
#[derive(Debug, Clone, PartialEq)]
pub struct Pixels {
    pub data: Vec<f32>,
    pub height: usize,
    pub width: usize,
}

/// mlx-vlm `get_aspect_ratio_preserving_size` (Gemma 4): `(height, width)` of the resize.
pub fn patch_budget_size(height: usize, width: usize, patch: usize, max_patches: usize, pooling: usize) -> Result<(usize, usize)> {
    let target_px = (max_patches * patch * patch) as f64;
    let factor = (target_px / (height * width) as f64).sqrt();
    let side = pooling * patch;
    let mut h = (factor * height as f64 / side as f64).floor() as usize * side;
    let mut w = (factor * width as f64 / side as f64).floor() as usize * side;
    if h == 0 && w == 0 {
        return Err(Error::InvalidRequest(format!("image: {width}x{height} resizes to 0 x 0")));
    }
    let max_side = (max_patches / (pooling * pooling)) * side;
    if h == 0 {
        h = side;
        w = ((width as f64 / height as f64).floor() as usize * side).min(max_side);
    } else if w == 0 {
        w = side;
        h = ((height as f64 / width as f64).floor() as usize * side).min(max_side);
    }
    Ok((h, w))
}

/// An 8-bit RGB image, row-major `[height, width, 3]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rgb8 {
    pub width: usize,
    pub height: usize,
    pub data: Vec<u8>,
}

use crate::limits::{MAX_PIXELS, MAX_SIDE};

/// Decodes PNG / JPEG / WebP bytes to RGB (transparency composited onto white).
pub fn decode(bytes: &[u8]) -> Result<Rgb8> {
    decode_with(bytes, true)
}

/// A buffer of `n` elements of `T` (zeroed), or an error, not an abort, when memory runs out.
pub(crate) fn try_zeroed<T: Clone + Default>(n: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| Error::Capacity(format!("image: out of memory for {n} values")))?;
    v.resize(n, T::default());
    Ok(v)
}

/// [`decode`]; `on_white: false` drops the alpha channel instead (PIL `convert("RGB")`).
/// The size is checked from the header (at most [`MAX_SIDE`] a side and [`MAX_PIXELS`] in
/// all) before any pixel buffer is allocated.
pub fn decode_with(bytes: &[u8], on_white: bool) -> Result<Rgb8> {
    let format = image::guess_format(bytes)
        .map_err(|_| Error::InvalidRequest("image: not a PNG, JPEG or WebP file".into()))?;
    if !matches!(format, image::ImageFormat::Png | image::ImageFormat::Jpeg | image::ImageFormat::WebP) {
        return Err(Error::InvalidRequest(format!("image: unsupported format {format:?} (PNG, JPEG or WebP)")));
    }
    let mut reader = image::ImageReader::with_format(std::io::Cursor::new(bytes), format);
    let mut limits = image::Limits::default();
    limits.max_alloc = Some(MAX_PIXELS * 8);
    limits.max_image_width = Some(MAX_SIDE);
    limits.max_image_height = Some(MAX_SIDE);
    reader.limits(limits);
    let too_big = |w: u64, h: u64| {
        Error::InvalidRequest(format!("image: {w}x{h} pixels (at most {MAX_SIDE} a side and {MAX_PIXELS} in all)"))
    };
    let decoder = reader.into_decoder().map_err(|e| match e {
        image::ImageError::Limits(_) => Error::InvalidRequest(format!(
            "image: larger than the limits ({e}; at most {MAX_SIDE} pixels a side and {MAX_PIXELS} in all)"
        )),
        e => Error::InvalidRequest(format!("image: cannot decode: {e}")),
    })?;
    let (w, h) = image::ImageDecoder::dimensions(&decoder);
    let (w, h) = (w as u64, h as u64);
    if w == 0 || h == 0 || w * h > MAX_PIXELS {
        return Err(too_big(w, h));
    }
    let img = image::DynamicImage::from_decoder(decoder)
        .map_err(|e| Error::InvalidRequest(format!("image: cannot decode: {e}")))?;
    if (img.width() as u64, img.height() as u64) != (w, h) {
        return Err(Error::InvalidRequest("image: the decoded size differs from the header's".into()));
    }
    let data = if on_white && img.color().has_alpha() {
        let rgba = img.to_rgba8();
        let mut data = try_zeroed::<u8>(rgba.len() / 4 * 3)?;
        for (out, p) in data.chunks_exact_mut(3).zip(rgba.pixels()) {
            out.copy_from_slice(&composite_on_white(p.0));
        }
        data
    } else {
        img.to_rgb8().into_raw()
    };
    Ok(Rgb8 { width: w as usize, height: h as usize, data })
}

/// Pillow's `alpha_composite` of a pixel over opaque white, then `convert("RGB")`
/// (AlphaComposite.c integer path, 7 extra bits of precision, divisions by 255 rounded).
fn composite_on_white([r, g, b, a]: [u8; 4]) -> [u8; 3] {
    if a == 0 {
        return [255, 255, 255];
    }
    const BITS: u32 = 7;
    let a = a as u32;
    let blend = 255 * (255 - a);
    let outa255 = a * 255 + blend;
    let coef1 = a * 255 * 255 * (1 << BITS) / outa255;
    let coef2 = 255 * (1 << BITS) - coef1;
    let div255 = |v: u32| ((v >> 8) + v) >> 8;
    let mix = |c: u8| (div255(c as u32 * coef1 + 255 * coef2 + (0x80 << BITS)) >> BITS) as u8;
    [mix(r), mix(g), mix(b)]
}

/// Pillow's fixed-point coefficients for one axis (Resample.c `precompute_coeffs` +
/// `normalize_coeffs_8bpc`): per output pixel, the first input index and its weights.
fn coefficients(in_size: usize, out_size: usize, filter: Resample) -> Vec<(usize, Vec<i32>)> {
    const PRECISION_BITS: u32 = 32 - 8 - 2;
    let scale = in_size as f64 / out_size as f64;
    let filterscale = scale.max(1.0);
    let support = filter.support() * filterscale;
    (0..out_size)
        .map(|xx| {
            let center = (xx as f64 + 0.5) * scale;
            let ss = 1.0 / filterscale;
            let xmin = ((center - support + 0.5) as i64).max(0) as usize;
            let xmax = ((center + support + 0.5) as i64).min(in_size as i64) as usize;
            let w: Vec<f64> = (xmin..xmax).map(|x| filter.weight((x as f64 - center + 0.5) * ss)).collect();
            let total: f64 = w.iter().sum();
            let fixed = w
                .iter()
                .map(|&k| {
                    let k = if total != 0.0 { k / total } else { k };
                    let v = k * (1u64 << PRECISION_BITS) as f64;
                    (if k < 0.0 { (v - 0.5).trunc() } else { (v + 0.5).trunc() }) as i32
                })
                .collect();
            (xmin, fixed)
        })
        .collect()
}

fn clip8(v: i64) -> u8 {
    (v >> (32 - 8 - 2)).clamp(0, 255) as u8
}

/// Pillow's `Image.resize` for 8-bit RGB: two passes, each rounding to u8. Horizontal first,
/// unless the height shrinks by more than twice as many pixels as the width does (Pillow 13
/// runs the vertical pass first then; measured against Pillow 13.0.0 on 645 size pairs).
pub fn resize(img: &Rgb8, width: usize, height: usize, filter: Resample) -> Rgb8 {
    let vertical_first =
        img.height > height && (img.height - height) as i64 > 2 * (img.width as i64 - width as i64);
    if vertical_first {
        resize_horizontal(&resize_vertical(img, height, filter), width, filter)
    } else {
        resize_vertical(&resize_horizontal(img, width, filter), height, filter)
    }
}

fn resize_horizontal(cur: &Rgb8, width: usize, filter: Resample) -> Rgb8 {
    if width == cur.width {
        return cur.clone();
    }
    let coeffs = coefficients(cur.width, width, filter);
    let mut out = vec![0u8; width * cur.height * 3];
    for y in 0..cur.height {
        for (x, (start, k)) in coeffs.iter().enumerate() {
            for c in 0..3 {
                let mut acc: i64 = 1 << (32 - 8 - 2 - 1);
                for (i, &w) in k.iter().enumerate() {
                    acc += cur.data[(y * cur.width + start + i) * 3 + c] as i64 * w as i64;
                }
                out[(y * width + x) * 3 + c] = clip8(acc);
            }
        }
    }
    Rgb8 { width, height: cur.height, data: out }
}

fn resize_vertical(cur: &Rgb8, height: usize, filter: Resample) -> Rgb8 {
    if height == cur.height {
        return cur.clone();
    }
    let coeffs = coefficients(cur.height, height, filter);
    let mut out = vec![0u8; cur.width * height * 3];
    for (y, (start, k)) in coeffs.iter().enumerate() {
        for x in 0..cur.width {
            for c in 0..3 {
                let mut acc: i64 = 1 << (32 - 8 - 2 - 1);
                for (i, &w) in k.iter().enumerate() {
                    acc += cur.data[((start + i) * cur.width + x) * 3 + c] as i64 * w as i64;
                }
                out[(y * cur.width + x) * 3 + c] = clip8(acc);
            }
        }
    }
    Rgb8 { width: cur.width, height, data: out }
}

impl ImageProcessor {
    /// Pixel values `[height, width, 3]` (channels last, what the towers take), f32.
    pub fn pixels(&self, img: &Rgb8) -> Vec<f32> {
        self.prepare(img).expect("a fixed-size processor does not fail").data
    }

    /// The size an image of `width x height` is resized to.
    pub fn output_size(&self, height: usize, width: usize) -> Result<(usize, usize)> {
        match self.sizing {
            Sizing::Fixed => Ok((self.height, self.width)),
            Sizing::PatchBudget { patch, max_patches, pooling } => {
                patch_budget_size(height, width, patch, max_patches, pooling)
            }
        }
    }

    /// Resizes and rescales (and for [`Sizing::Fixed`] normalises) a decoded image.
    pub fn prepare(&self, img: &Rgb8) -> Result<Pixels> {
        let (height, width) = self.output_size(img.height, img.width)?;
        let resized;
        let img = if (height, width) == (img.height, img.width) {
            img
        } else {
            resized = resize(img, width, height, self.resample);
            &resized
        };
        let data = match self.sizing {
            Sizing::Fixed => img
                .data
                .iter()
                .enumerate()
                .map(|(i, &v)| {
                    let c = i % 3;
                    let x = (v as f64 * self.rescale_factor) as f32;
                    (x - self.mean[c]) / self.std[c]
                })
                .collect(),
            // numpy: a float32 array times a Python float stays float32.
            Sizing::PatchBudget { .. } => {
                let f = self.rescale_factor as f32;
                img.data.iter().map(|&v| v as f32 * f).collect()
            }
        };
        Ok(Pixels { data, height, width })
    }

    /// Decodes and preprocesses an encoded image.
    pub fn process(&self, bytes: &[u8]) -> Result<Vec<f32>> {
        Ok(self.process_sized(bytes)?.data)
    }

    /// Decodes and preprocesses an encoded image, with its output size.
    pub fn process_sized(&self, bytes: &[u8]) -> Result<Pixels> {
        self.prepare(&decode_with(bytes, self.sizing == Sizing::Fixed)?)
    }

    /// Decodes an encoded image and preprocesses its views: the image itself, then its
    /// pan-and-scan crops when `pan_and_scan` is on (`None`: as the processor config says).
    pub fn process_views(&self, bytes: &[u8], pan_and_scan: Option<bool>) -> Result<Vec<Pixels>> {
        let img = decode_with(bytes, self.sizing == Sizing::Fixed)?;
        let pas = match pan_and_scan {
            Some(false) => None,
            Some(true) => Some(self.pan_and_scan.unwrap_or_default()),
            None => self.pan_and_scan,
        };
        if pas.is_some() && self.sizing != Sizing::Fixed {
            return Err(Error::InvalidRequest("image: pan_and_scan is a Gemma 3 option; this model has none".into()));
        }
        let crops = pas.map(|p| p.crops(&img)).unwrap_or_default();
        std::iter::once(&img).chain(&crops).map(|v| self.prepare(v)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resize_to_the_same_size_is_identity_and_constant_stays_constant() {
        let img = Rgb8 { width: 3, height: 2, data: (0..18).map(|v| v as u8 * 10).collect() };
        assert_eq!(resize(&img, 3, 2, Resample::Bilinear), img);
        let flat = Rgb8 { width: 7, height: 5, data: vec![77; 7 * 5 * 3] };
        for f in [Resample::Bilinear, Resample::Bicubic] {
            assert!(resize(&flat, 3, 9, f).data.iter().all(|&v| v == 77));
        }
    }

    #[test]
    fn patch_budget_sizes_match_mlx_vlm() {
        // mlx-vlm get_aspect_ratio_preserving_size(h, w, 16, 280 * 9, 3), incl. the
        // zero-side fallbacks (values from mlx-vlm 0.7.10).
        for ((h, w), want) in [
            ((45, 61), (672, 912)),
            ((10, 1000), (48, 8016)),
            ((2, 1000), (48, 13440)),
            ((1000, 2), (13440, 48)),
            ((1, 1), (768, 768)),
        ] {
            assert_eq!(patch_budget_size(h, w, 16, 280 * 9, 3).unwrap(), want, "{h}x{w}");
        }
    }

    #[test]
    fn pan_and_scan_crops_as_transformers_cuts_them() {
        let p = PanAndScan { min_crop_size: 16, max_num_crops: 4, min_ratio_to_activate: 1.2 };
        let img = |w: usize, h: usize| Rgb8 { width: w, height: h, data: (0..w * h * 3).map(|v| v as u8).collect() };
        let sizes = |w, h| p.crops(&img(w, h)).iter().map(|c| (c.width, c.height)).collect::<Vec<_>>();
        assert_eq!(sizes(61, 45), [(31, 45), (30, 45)]);
        assert_eq!(sizes(100, 20), [(25, 20); 4]);
        assert_eq!(sizes(20, 70), [(20, 18), (20, 18), (20, 18), (20, 16)]);
        assert!(sizes(24, 20).is_empty(), "12 px crops are under min_crop_size");
        assert!(sizes(40, 40).is_empty(), "square: ratio 1 < 1.2");
        // The second crop of 61x45 starts at column 31.
        let src = img(61, 45);
        let c = &p.crops(&src)[1];
        assert_eq!(&c.data[..3], &src.data[31 * 3..32 * 3]);
    }

    #[test]
    fn pan_and_scan_config_fields_and_defaults() {
        let on = serde_json::json!({"do_pan_and_scan": true, "pan_and_scan_min_crop_size": null});
        assert_eq!(PanAndScan::from_config(&on).unwrap(), Some(PanAndScan::default()));
        let nested = serde_json::json!({"image_processor": {"do_pan_and_scan": true, "pan_and_scan_max_num_crops": 2}});
        assert_eq!(PanAndScan::from_config(&nested).unwrap().unwrap().max_num_crops, 2);
        assert_eq!(PanAndScan::from_config(&serde_json::json!({"do_pan_and_scan": null})).unwrap(), None);
        assert!(PanAndScan::from_config(&serde_json::json!({"do_pan_and_scan": true, "pan_and_scan_min_crop_size": -1})).is_err());
    }

    #[test]
    fn alpha_composites_onto_white() {
        assert_eq!(composite_on_white([10, 20, 30, 255]), [10, 20, 30]);
        assert_eq!(composite_on_white([10, 20, 30, 0]), [255, 255, 255]);
        assert_eq!(composite_on_white([0, 0, 0, 128]), [127, 127, 127]);
    }
}
