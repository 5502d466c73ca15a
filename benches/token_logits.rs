//! Teacher-forced next-token logits at every position of token sequences, one decode step (one
//! row) per token, as generation computes them: the fast kernel's int8 activations apply below
//! 16 rows, so a batched prefill would not show them. `benches/int8_kl.py` compares the output
//! across Weft's CPU modes and llama.cpp.
//!
//!     cargo run --release -p weft-core --example token_logits -- MODEL IDS OUT
//!         [--cpu-kernels exact|fast] [--cpu-activations float|int8]
//!
//! IDS: one sequence a line, token ids separated by spaces. OUT: float32 little-endian logits,
//! [positions, vocab] per sequence, the sequences one after another.

use std::io::Write;

use mlx_rs::{Array, Dtype};
use weft::kernels::{CpuActivations, CpuKernels};
use weft::loading::{load_with, LoadOptions};
use weft::nn::last_position;

fn main() -> weft::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: token_logits MODEL IDS OUT [--cpu-kernels exact|fast] [--cpu-activations float|int8]";
    let (model, ids, out) = match &args[..] {
        [m, i, o, ..] => (m, i, o),
        _ => panic!("{usage}"),
    };
    let flag = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let mut opts = LoadOptions::default();
    if let Some(k) = flag("--cpu-kernels") {
        opts.cpu_kernels = k.parse::<CpuKernels>()?;
    }
    if let Some(a) = flag("--cpu-activations") {
        opts.cpu_activations = Some(a.parse::<CpuActivations>()?);
    }
    let loaded = load_with(std::path::Path::new(model), &opts)?;
    let m = loaded.model.as_ref();
    let text = std::fs::read_to_string(ids).expect("reading IDS");
    let mut w = std::io::BufWriter::new(std::fs::File::create(out).expect("creating OUT"));
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let seq: Vec<i32> = line.split_whitespace().map(|t| t.parse().expect("token id")).collect();
        let mut caches = m.make_caches();
        for &t in &seq {
            let logits = last_position(&m.forward(&Array::from_slice(&[t], &[1, 1]), &mut caches)?)?.as_dtype(Dtype::Float32)?;
            logits.eval()?;
            let v = weft::prefill::as_f32_slice(&logits)?;
            for x in v {
                w.write_all(&x.to_le_bytes()).expect("writing OUT");
            }
        }
    }
    eprintln!("numerics {}", loaded.numerics);
    Ok(())
}
