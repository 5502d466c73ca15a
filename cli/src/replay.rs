//! `weft replay --plan plan.json`: a join/leave schedule through the continuous-batching
//! engine. `at_step` k submits a row just before the engine's k-th decode step (while the
//! engine is idle its step count does not advance, so such rows are submitted at once).

use std::path::PathBuf;

use clap::Args;
use serde::Deserialize;
use serde_json::json;
use weft::engine::{EngineConfig, Input, Request};
use weft::sampling::SamplingParams;
use weft::{Error, Result};

use crate::batch::Collector;
use crate::options::Options;
use crate::common::{load_model, KvArgs, ModelArgs};

#[derive(Args, Debug)]
pub struct ReplayArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The schedule: {"max_batch": 8, "inserts": [{"at_step": 0, "id": "a", "prompt_ids": [..],
    /// "max_tokens": 8, "eos": false}, ...]}.
    #[arg(long)]
    pub plan: PathBuf,
    /// Print the result as JSON (the only output format).
    #[arg(long)]
    pub json: bool,
    /// Prompt tokens per prefill chunk (overrides the plan's "prefill_step_size").
    #[arg(long)]
    pub prefill_step_size: Option<usize>,
    #[command(flatten)]
    pub kv: KvArgs,
}

#[derive(Deserialize)]
struct Plan {
    #[serde(default = "default_max_batch")]
    max_batch: usize,
    #[serde(default)]
    prefill_step_size: Option<usize>,
    inserts: Vec<Insert>,
}

fn default_max_batch() -> usize {
    8
}

#[derive(Deserialize)]
struct Insert {
    at_step: u64,
    #[serde(deserialize_with = "id_string")]
    id: String,
    prompt_ids: Vec<u32>,
    max_tokens: usize,
    #[serde(default)]
    eos: bool,
}

/// Row ids may be strings or numbers; output keys are their string form.
fn id_string<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<String, D::Error> {
    match serde_json::Value::deserialize(d)? {
        serde_json::Value::String(s) => Ok(s),
        serde_json::Value::Number(n) => Ok(n.to_string()),
        other => Err(serde::de::Error::custom(format!("row id must be a string or number, got {other}"))),
    }
}

pub fn run(args: ReplayArgs, opts: &Options) -> Result<()> {
    let text = std::fs::read_to_string(&args.plan).map_err(|e| Error::io(&args.plan, e))?;
    let plan: Plan = serde_json::from_str(&text)
        .map_err(|e| Error::InvalidRequest(format!("{}: invalid plan: {e}", args.plan.display())))?;
    let mut seen = std::collections::HashSet::new();
    if let Some(dup) = plan.inserts.iter().find(|i| !seen.insert(i.id.as_str())) {
        return Err(Error::InvalidRequest(format!("plan row id {:?} appears twice", dup.id)));
    }
    let prefill = args.prefill_step_size.or(plan.prefill_step_size).unwrap_or(2048);
    let config = args.kv.apply(EngineConfig {
        max_batch: plan.max_batch,
        prompt_concurrency: plan.max_batch,
        prefill_step_size: prefill,
        ..EngineConfig::default()
    });
    let config = opts.engine_config(config)?;
    let loaded = load_model(&args.model, opts)?;
    let mut engine = Collector::new(loaded, config)?;

    let mut order: Vec<&Insert> = plan.inserts.iter().collect();
    order.sort_by_key(|i| i.at_step);
    let mut ids = Vec::new();
    let mut next = 0;
    loop {
        while next < order.len()
            && (order[next].at_step <= engine.core.decode_steps() || engine.core.is_idle())
        {
            let ins = order[next];
            let req = Request {
                input: Input::Tokens(ins.prompt_ids.clone()),
                max_tokens: ins.max_tokens,
                sampling: SamplingParams::greedy(),
                stop: Vec::new(),
                ignore_eos: !ins.eos,
                capture_first_logits: 0,
                logprobs: None,
                tools: None,
                constraint: None,
                images: Vec::new(),
                ..Request::new(Input::Tokens(Vec::new()))
            };
            engine.submit(req).map_err(|e| Error::InvalidRequest(format!("row {:?}: {e}", ins.id)))?;
            ids.push(ins.id.clone());
            next += 1;
        }
        if next == order.len() && engine.core.is_idle() {
            break;
        }
        engine.core.iterate();
    }
    let steps = engine.core.decode_steps();
    let mut rows = serde_json::Map::new();
    for (id, (_, r)) in ids.into_iter().zip(engine.results()) {
        let mut row = json!({"tokens": r.tokens, "finish_reason": r.finish_str()});
        if let Some(e) = r.error {
            row["error"] = json!(e);
        }
        rows.insert(id, row);
    }
    println!("{}", json!({"rows": rows, "steps": steps}));
    Ok(())
}
