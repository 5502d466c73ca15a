//! Where the host time of one B=1 decode step goes: the operations the step's graph holds (by
//! primitive) and, per step, the time to build the graph (the forward, the last position, the
//! greedy tail: log-softmax and argmax, as the engine's `choose`) against the time to evaluate
//! it, over the engine's batched caches. Medians over the steps. The graph-building code is the
//! same on every device, so its cost and op count measured on the CPU are the GPU's too.
//!
//!     cargo run --release -p weft-core --example step_profile -- MODEL [--steps N]
//!         [--prompt-len P] [--compile 0|1] [--fuse 0|1] [--dequantize-rows N]
//!         [--cpu-kernels exact|fast] [--ops] [--graph] [--batch B] [--tail] [--dispatch N]
//!
//! `--batch B` decodes B rows (each prefilled alone, then joined, as the engine batches);
//! `--mlx-tail` keeps MLX's logsumexp in the tail; `--tail` also times the greedy tail alone over evaluated logits; `--dispatch N` times MLX's
//! cost per op (a chain of N adds of one hidden-size row).
//! `--ops` prints every primitive's count, `--graph` the whole graph of one step; `--compile` and `--fuse` set `LoadOptions::compile`
//! and `fuse_projections`, `--dequantize-rows` `LoadOptions::dequantize_rows`. On the CPU,
//! `--cpu-kernels fast --fuse 0 --dequantize-rows 512` builds the GPU's graph: RMSNorm, RoPE
//! and attention one primitive each (in exact mode MLX expands them into their fallback graphs
//! on the CPU), separate projections, quantized matmuls on the GPU's path (MLX's op over rows
//! flattened).

use std::time::Instant;

use mlx_rs::Array;
use weft::kernels::CpuKernels;
use weft::sampling::Sampler;
use weft::loading::{load_with, LoadOptions};
use weft::nn::{compiled::graph_ops, last_position};

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() -> weft::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let model = args.first().expect("usage: step_profile MODEL [--steps N] [--prompt-len P] [--compile 0|1] [--cpu-kernels exact|fast] [--ops] [--graph]");
    let flag = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let steps: usize = flag("--steps").map_or(64, |s| s.parse().expect("--steps N"));
    let prompt_len: i32 = flag("--prompt-len").map_or(32, |s| s.parse().expect("--prompt-len P"));
    let mut opts = LoadOptions::default();
    opts.compile = flag("--compile").map(|v| v == "1");
    opts.fuse_projections = flag("--fuse").map(|v| v == "1");
    opts.dequantize_rows = flag("--dequantize-rows").map(|v| v.parse().expect("--dequantize-rows N"));
    if let Some(k) = flag("--cpu-kernels") {
        opts.cpu_kernels = k.parse::<CpuKernels>()?;
    }
    let loaded = load_with(std::path::Path::new(model), &opts)?;
    let m = loaded.model.as_ref();
    let vocab = m.info().vocab_size;
    let prompt: Vec<u32> = (0..prompt_len).map(|i| ((i as u32) * 7919 + 13) % vocab as u32).collect();
    // The engine's tail: Weft's log-softmax primitive when the model runs fast CPU kernels.
    let fast_tail = m.fast_cpu_kernels() && !args.iter().any(|a| a == "--mlx-tail");
    let batch: i32 = flag("--batch").map_or(1, |s| s.parse().expect("--batch B"));
    // The engine decodes over batched caches: `batch` rows, each prefilled alone, then joined.
    let mut caches: Option<Vec<Box<dyn weft::cache::KvCache>>> = None;
    for _ in 0..batch {
        let mut row = m.make_caches();
        let logits = m.forward(&Array::from_slice(&prompt, &[1, prompt_len]), &mut row)?;
        let state: Vec<Array> = row.iter().flat_map(|c| c.state()).chain(std::iter::once(logits)).collect();
        mlx_rs::transforms::eval(&state)?;
        let row: Vec<_> = row.into_iter().map(|c| c.into_batched()).collect::<weft::Result<_>>()?;
        caches = Some(match caches {
            None => row,
            Some(mut all) => {
                for (dst, r) in all.iter_mut().zip(row) {
                    weft::cache::extend_rows(dst.as_mut(), r)?;
                }
                all
            }
        });
    }
    let mut caches = caches.expect("--batch >= 1");
    let mut token = Array::from_slice(&vec![prompt[0]; batch as usize], &[batch, 1]);
    let (mut build, mut eval, mut tail) = (Vec::new(), Vec::new(), Vec::new());
    let split_tail = args.iter().any(|a| a == "--tail");
    let mut ops = Vec::new();
    for step in 0..steps + 4 {
        let t0 = Instant::now();
        let logits = last_position(&m.forward(&token, &mut caches)?)?;
        if split_tail {
            // The forward alone, then the tail over its evaluated logits.
            let t = Instant::now();
            logits.eval()?;
            let lp = Sampler::logprobs_with(&logits, fast_tail)?;
            let next = mlx_rs::ops::indexing::argmax_axis(&lp, -1, None)?;
            let t_mid = Instant::now();
            next.eval()?;
            if step >= 4 {
                tail.push((Instant::now() - t_mid).as_secs_f64() * 1e3);
                let _ = t;
            }
        }
        let lp = Sampler::logprobs_with(&logits, fast_tail)?;
        let next = mlx_rs::ops::indexing::argmax_axis(&lp, -1, None)?;
        let t1 = Instant::now();
        // Counted on a steady step (the first one grows the KV storage).
        if step == 3 {
            ops = graph_ops(&[&next])?;
            if args.iter().any(|a| a == "--graph") {
                println!("{}", weft::nn::compiled::graph_text(&[&next])?);
            }
        }
        let t2 = Instant::now();
        next.eval()?;
        let t3 = Instant::now();
        token = next.reshape(&[batch, 1])?;
        // The first steps warm MLX's caches (and trace compiled chains).
        if step >= 4 {
            build.push((t1 - t0).as_secs_f64() * 1e3);
            eval.push((t3 - t2).as_secs_f64() * 1e3);
        }
    }
    if split_tail {
        println!("tail (logsumexp, subtract, argmax over evaluated logits) ms/step median {:.3}", median(&mut tail));
    }
    if let Some(n) = flag("--dispatch").map(|v| v.parse::<usize>().expect("--dispatch N")) {
        // MLX's cost per op on this stream: a chain of n adds of one hidden-size row.
        let width = m.info().hidden_size;
        let x = Array::from_slice(&vec![1.0f32; width as usize], &[1, 1, width]);
        x.eval()?;
        let mut per_op = Vec::new();
        for _ in 0..20 {
            let mut y = x.clone();
            for _ in 0..n {
                y = y.add(&x)?;
            }
            let t = Instant::now();
            y.eval()?;
            per_op.push((Instant::now() - t).as_secs_f64() * 1e6 / n as f64);
        }
        println!("dispatch: chain of {n} adds [1, 1, {width}], us/op median {:.2}", median(&mut per_op));
    }
    let total: usize = ops.iter().map(|(_, n)| n).sum();
    println!(
        "model {model}\nfast tail {fast_tail}\nnumerics {}\nops per step {total} ({} layers)\nbuild ms/step median {:.3}\neval ms/step median {:.3}",
        loaded.numerics,
        m.info().num_layers,
        median(&mut build),
        median(&mut eval)
    );
    if args.iter().any(|a| a == "--ops") {
        for (name, n) in &ops {
            println!("  {n:5} {name}");
        }
    }
    Ok(())
}
