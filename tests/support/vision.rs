//! Shared by the image tests (tests/vision.rs, tests/gemma4_vision.rs): the goldens' images,
//! cases and pixel layouts.

use mlx_rs::Array;
use serde_json::Value;
use weft::engine::Request;

use crate::support::{goldens_dir, greedy, ids};

/// An array's values as float32, evaluated.
pub fn values(a: &Array) -> Vec<f32> {
    let a = a.as_dtype(mlx_rs::Dtype::Float32).unwrap();
    a.eval().unwrap();
    a.as_slice::<f32>().to_vec()
}

/// The bytes of goldens/vision/NAME.png.
pub fn image_bytes(name: &str) -> Vec<u8> {
    std::fs::read(goldens_dir().join("vision").join(format!("{name}.png"))).unwrap()
}

/// The golden's case called `name`.
pub fn case<'a>(g: &'a Value, name: &str) -> &'a Value {
    g["cases"].as_array().unwrap().iter().find(|c| c["name"] == name).unwrap_or_else(|| panic!("no case {name}"))
}

/// A greedy request for a case: its prompt ids and its images.
pub fn request(c: &Value, max_tokens: usize) -> Request {
    let mut r = greedy(ids(&c["prompt_ids"]), max_tokens);
    r.images = c["images"].as_array().unwrap().iter().map(|i| image_bytes(i.as_str().unwrap())).collect();
    r
}

/// Channels-last pixels from the golden's `[3, H, W]`.
pub fn hwc(chw: &[f32], h: usize, w: usize) -> Vec<f32> {
    let mut out = vec![0.0; chw.len()];
    for c in 0..3 {
        for y in 0..h {
            for x in 0..w {
                out[(y * w + x) * 3 + c] = chw[(c * h + y) * w + x];
            }
        }
    }
    out
}
