//! `weft gdn-check` (hidden): the gated delta recurrence run by two implementations on the
//! current device, for checking a kernel where it runs (the CUDA kernel on the lent GPU). On
//! random inputs of several shapes (padding masks, Hv > Hk, batch > 1, T = 1 and long prompts,
//! float32 and bfloat16): the max abs difference of y (real steps) and of the final state
//! from the ops path, and each path's median time. With `--model DIR`: that model loaded with
//! each implementation, greedy tokens and first-step logits from a few random prompts.
//! Exits non-zero when a difference passes the tolerance or a token differs.

use std::time::Instant;

use clap::Args;
use mlx_rs::{Array, Dtype};
use weft::generate::{generate, GenerateOptions};
use weft::nn::{gated_delta_recurrence, GatedDeltaKernel};
use weft::{Error, Result};

use crate::options::Options;

#[derive(Args, Debug)]
pub struct GdnCheckArgs {
    /// The implementation checked against the ops path: `cuda`, `fused` or `cpu`.
    #[arg(long, default_value = "cuda")]
    pub kernel: String,
    /// Timed runs per shape (after one warm-up); the median is printed.
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Also compare a hybrid model (a golden model directory) loaded with each implementation.
    #[arg(long)]
    pub model: Vec<std::path::PathBuf>,
    /// Greedy tokens per prompt in the model comparison.
    #[arg(long, default_value_t = 24)]
    pub tokens: usize,
}

/// (B, T, Hk, Hv, Dk, Dv, real tokens per row or none).
type Shape = (i32, i32, i32, i32, i32, i32, Option<Vec<i32>>);

fn shapes() -> Vec<(&'static str, Shape)> {
    vec![
        ("tiny decode", (1, 1, 2, 4, 16, 16, None)),
        ("tiny batched padded", (3, 37, 2, 4, 16, 16, Some(vec![37, 20, 1]))),
        ("odd dims", (2, 9, 3, 3, 48, 40, Some(vec![9, 4]))),
        ("4B decode B=1", (1, 1, 16, 32, 128, 128, None)),
        ("4B decode B=8", (8, 1, 16, 32, 128, 128, None)),
        ("4B prefill B=1 T=1024", (1, 1024, 16, 32, 128, 128, None)),
        ("4B prefill B=8 T=256 padded", (8, 256, 16, 32, 128, 128, Some(vec![256, 200, 17, 256, 1, 128, 255, 64]))),
    ]
}

fn uniform(seed: u64, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            lo + (hi - lo) * ((x >> 40) as f32 / (1u64 << 24) as f32)
        })
        .collect()
}

struct Inputs {
    q: Array,
    k: Array,
    v: Array,
    g: Array,
    beta: Array,
    state: Array,
    mask: Option<Array>,
}

fn inputs(s: &Shape, dtype: Dtype, seed: u64) -> Result<Inputs> {
    let (b, t, hk, hv, dk, dv, lengths) = s;
    let unit = |a: Array| -> Result<Array> {
        let norm = a.square()?.sum_axis(-1, true)?.sqrt()?;
        Ok(a.divide(&norm)?.as_dtype(dtype)?)
    };
    let n_qk = (b * t * hk * dk) as usize;
    let gates = (b * t * hv) as usize;
    let mask = lengths.as_ref().map(|lens| {
        let m: Vec<bool> = lens.iter().flat_map(|&l| (0..*t).map(move |i| i < l)).collect();
        Array::from_slice(&m, &[*b, *t])
    });
    Ok(Inputs {
        q: unit(Array::from_slice(&uniform(seed, n_qk, -1.0, 1.0), &[*b, *t, *hk, *dk]))?,
        k: unit(Array::from_slice(&uniform(seed + 1, n_qk, -1.0, 1.0), &[*b, *t, *hk, *dk]))?,
        v: Array::from_slice(&uniform(seed + 2, (b * t * hv * dv) as usize, -1.0, 1.0), &[*b, *t, *hv, *dv]).as_dtype(dtype)?,
        // The decay is float32 in the model (exp of a float32 product), beta the model's dtype.
        g: Array::from_slice(&uniform(seed + 3, gates, 0.5, 1.0), &[*b, *t, *hv]),
        beta: Array::from_slice(&uniform(seed + 4, gates, 0.0, 1.0), &[*b, *t, *hv]).as_dtype(dtype)?,
        state: Array::from_slice(&uniform(seed + 5, (b * hv * dv * dk) as usize, -0.3, 0.3), &[*b, *hv, *dv, *dk]),
        mask,
    })
}

fn run(kernel: GatedDeltaKernel, x: &Inputs) -> Result<(Array, Array)> {
    let (y, s) = gated_delta_recurrence(kernel, &x.q, &x.k, &x.v, &x.g, &x.beta, Some(x.state.clone()), x.mask.as_ref())?;
    // Masked steps are padding: the fused and CUDA paths write 0 there, the ops path does not.
    let y = match &x.mask {
        Some(m) => mlx_rs::ops::select(m.expand_dims_axes(&[2, 3])?, &y, Array::from_f32(0.0).as_dtype(y.dtype())?)?,
        None => y,
    };
    mlx_rs::transforms::eval([&y, &s])?;
    Ok((y, s))
}

fn max_abs_diff(a: &Array, b: &Array) -> Result<f32> {
    let d = a.as_dtype(Dtype::Float32)?.subtract(b.as_dtype(Dtype::Float32)?)?;
    d.abs()?.max(None)?.try_item_cast::<f32>().map_err(|e| Error::Mlx(format!("reading a difference: {e}")))
}

fn median_ms(runs: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs.max(1) {
        let start = Instant::now();
        f()?;
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(|a, b| a.partial_cmp(b).unwrap());
    Ok(times[times.len() / 2])
}

pub fn run_check(a: GdnCheckArgs, opts: &Options) -> Result<()> {
    let kernel: GatedDeltaKernel = a.kernel.parse()?;
    println!("device: {} (mlx default); checking {} against ops", weft::default_device(), kernel.as_str());
    let mut bad = 0;
    for (i, (name, shape)) in shapes().iter().enumerate() {
        for dtype in [Dtype::Float32, Dtype::Bfloat16] {
            let x = inputs(shape, dtype, 1000 + i as u64)?;
            let (y_ops, s_ops) = run(GatedDeltaKernel::Ops, &x)?;
            let (y_k, s_k) = run(kernel, &x)?;
            let (dy, ds) = (max_abs_diff(&y_ops, &y_k)?, max_abs_diff(&s_ops, &s_k)?);
            // Float32: only the sums' order differs. Bfloat16: y is rounded to 8 bits.
            let tol = if dtype == Dtype::Float32 { 1e-3 } else { 5e-2 };
            let ok = dy <= tol && ds <= tol && dy.is_finite() && ds.is_finite();
            bad += !ok as usize;
            let t_ops = median_ms(a.runs, || run(GatedDeltaKernel::Ops, &x).map(|_| ()))?;
            let t_k = median_ms(a.runs, || run(kernel, &x).map(|_| ()))?;
            println!(
                "{} {name} {dtype:?}: max |dy| {dy:.3e}, max |dstate| {ds:.3e} (tol {tol:.0e}); ops {t_ops:.3} ms, {} {t_k:.3} ms ({:.1}x)",
                if ok { "ok  " } else { "FAIL" },
                kernel.as_str(),
                t_ops / t_k
            );
        }
    }
    for dir in &a.model {
        let load = |k| {
            let o = weft::loading::LoadOptions { gated_delta: Some(k), ..opts.load.clone() };
            weft::loading::load_with(dir, &o)
        };
        let (ops, fast) = (load(GatedDeltaKernel::Ops)?, load(kernel)?);
        let vocab = ops.model.info().vocab_size;
        let mut seed = 7u64;
        for row in 0..4 {
            let len = 4 + (row * 37) % 60;
            let prompt: Vec<u32> =
                uniform(seed, len, 1.0, vocab as f32 - 1.0).into_iter().map(|x| x as u32).collect();
            seed += 11;
            let o = GenerateOptions {
                max_tokens: a.tokens,
                capture_first_logits: vocab as usize,
                stop_token_ids: Vec::new(),
                ..GenerateOptions::default()
            };
            let r_ops = generate(ops.model.as_ref(), None, &prompt, &o, |_| true)?;
            let r_k = generate(fast.model.as_ref(), None, &prompt, &o, |_| true)?;
            let dl = r_ops.first_logits.iter().zip(&r_k.first_logits).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            let same = r_ops.tokens == r_k.tokens;
            bad += !same as usize;
            println!(
                "{} {} prompt {row} ({len} tokens): {} greedy tokens {}, first logits max |d| {dl:.3e}",
                if same { "ok  " } else { "FAIL" },
                dir.display(),
                r_ops.tokens.len(),
                if same { "equal".to_string() } else { format!("differ: ops {:?} vs {:?}", r_ops.tokens, r_k.tokens) }
            );
        }
    }
    if bad > 0 {
        return Err(Error::Mlx(format!("gdn-check: {bad} check(s) failed")));
    }
    println!("all checks passed");
    Ok(())
}
