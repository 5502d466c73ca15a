//! Pipelined decode for every row kind. One mixed batch — plain greedy rows, greedy rows through
//! mlx-lm's logits processors (penalties, logit bias), seeded sampled rows (top-p / top-k /
//! min-p, penalties), rows with log-probabilities, constrained rows (greedy and sampled) — runs
//! once pipelined (every step built from the previous step's unread tokens) and once with
//! `DecodeMode::Synchronous` (every step read before the next is built). Each row's tokens, text,
//! finish and log-probabilities must be identical, and the greedy rows must equal mlx-lm's
//! goldens (the processor rows: mlx-lm's processed trajectories, so the penalty window that
//! takes the in-flight token from the device is checked against the oracle).

mod support;
mod tokenizer_support;

use serde_json::{json, Value};
use support::*;
use tokenizer_support::{tiny_tokenizer_gguf, TempDir};
use weft::engine::{Constraint, DecodeMode, Engine, EngineConfig, Event, Request, TokenLogprobs};
use weft::generate::FinishReason;
use weft::gguf::GgufHeader;
use weft::loading::LoadedModel;
use weft::sampling::SamplingParams;
use weft::tokenizer::Tokenizer;

const MODEL: &str = "llama-fp32";

fn model_with_tokenizer() -> LoadedModel {
    let dir = TempDir::new("pipelined-tok");
    let path = tiny_tokenizer_gguf("gpt2").write(&dir.path("tok.gguf"));
    let tokenizer = Tokenizer::from_gguf(&GgufHeader::read(path).unwrap()).unwrap();
    let mut model = support::load_exact(&tiny_model_dir(MODEL)).unwrap();
    model.tokenizer = Some(tokenizer);
    model
}

/// A request of the batch, and the tokens mlx-lm produced for it (greedy rows only).
struct Row {
    what: String,
    request: Request,
    golden: Option<Vec<u32>>,
}

fn rows() -> Vec<Row> {
    let mut rows = Vec::new();
    let g = golden(MODEL);
    for (i, c) in g["single"].as_array().unwrap().iter().take(2).enumerate() {
        let want = ids(&c["tokens"]);
        rows.push(Row { what: format!("greedy {i}"), request: greedy(ids(&c["prompt_ids"]), want.len()), golden: Some(want) });
    }
    // mlx-lm's processed greedy trajectories (one-chunk prefill, as the engine here does).
    let procs = serde_json::from_str::<Value>(&std::fs::read_to_string(goldens_dir().join("sampling/processors.json")).unwrap()).unwrap();
    let cases: Vec<Value> = procs["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["model"] == MODEL)
        .unwrap()["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["differs_from_greedy"].as_bool().unwrap() && c["prefill_step_size"].as_u64().unwrap() >= 2048)
        .cloned()
        .collect();
    let pick = |pred: &dyn Fn(&Value) -> bool| cases.iter().find(|c| pred(&c["params"])).cloned();
    let with_penalty = |name: &'static str| move |p: &Value| !p[name].is_null();
    let chosen: Vec<Value> = [
        pick(&with_penalty("repetition_penalty")),
        pick(&with_penalty("frequency_penalty")),
        pick(&with_penalty("presence_penalty")),
        pick(&|p: &Value| !p["logit_bias"].as_array().unwrap().is_empty()),
    ]
    .into_iter()
    .flatten()
    .collect();
    assert!(chosen.len() >= 3, "too few processor goldens to exercise");
    for (i, c) in chosen.iter().enumerate() {
        let p = &c["params"];
        let f = |v: &Value| v.as_f64().map(|x| x as f32);
        let sampling = SamplingParams {
            logit_bias: p["logit_bias"].as_array().unwrap().iter().map(|b| (b[0].as_u64().unwrap() as u32, b[1].as_f64().unwrap() as f32)).collect(),
            repetition_penalty: f(&p["repetition_penalty"]),
            presence_penalty: f(&p["presence_penalty"]),
            frequency_penalty: f(&p["frequency_penalty"]),
            penalty_context: p["context_size"].as_u64().unwrap() as usize,
            ..SamplingParams::default()
        };
        let want = ids(&c["tokens"]);
        // The first processor row also asks for log-probabilities.
        let request = Request { sampling, logprobs: (i == 0).then_some(4), ..greedy(ids(&c["prompt_ids"]), want.len()) };
        rows.push(Row { what: format!("processors {}", c["name"]), request, golden: Some(want) });
    }
    let sampled = |seed: u64, s: SamplingParams| SamplingParams { seed: Some(seed), ..s };
    let sampled_rows = [
        sampled(11, SamplingParams { temperature: 0.9, top_p: 0.95, ..Default::default() }),
        sampled(12, SamplingParams { temperature: 1.2, top_k: 20, min_p: 0.05, repetition_penalty: Some(1.3), ..Default::default() }),
        sampled(13, SamplingParams { temperature: 0.7, presence_penalty: Some(0.5), frequency_penalty: Some(0.25), logit_bias: vec![(7, 3.0)], ..Default::default() }),
    ];
    for (i, s) in sampled_rows.into_iter().enumerate() {
        let request = Request { sampling: s, logprobs: (i != 1).then_some(3), ..greedy(vec![5 + i as u32, 17, 3, 250, 11], 20 + 7 * i) };
        rows.push(Row { what: format!("sampled {i}"), request, golden: None });
    }
    rows.push(Row { what: "greedy with logprobs".into(), request: Request { logprobs: Some(0), ..greedy(vec![9, 8, 7, 6], 18) }, golden: None });
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}, "b": {"type": "string", "maxLength": 6}},
                        "required": ["a", "b"], "additionalProperties": false});
    rows.push(Row {
        what: "constrained greedy".into(),
        request: Request { constraint: Some(Constraint::JsonSchema(schema)), ignore_eos: false, logprobs: Some(2), ..greedy(vec![3, 4, 5], 80) },
        golden: None,
    });
    rows.push(Row {
        what: "constrained sampled".into(),
        request: Request {
            constraint: Some(Constraint::Regex("[a-z]{4,30}".into())),
            ignore_eos: false,
            sampling: sampled(14, SamplingParams { temperature: 1.0, top_p: 0.9, repetition_penalty: Some(1.2), ..Default::default() }),
            ..greedy(vec![6, 2], 24)
        },
        golden: None,
    });
    rows
}

/// What a row produced, log-probabilities included (as bits, so equal means bit-equal).
#[derive(Debug, PartialEq)]
struct Output {
    tokens: Vec<u32>,
    text: String,
    finish: Option<FinishReason>,
    error: Option<String>,
    logprobs: Vec<(u32, Vec<(u32, u32)>)>,
}

fn bits(lp: &TokenLogprobs) -> (u32, Vec<(u32, u32)>) {
    (lp.logprob.to_bits(), lp.top.iter().map(|&(t, v)| (t, v.to_bits())).collect())
}

/// Submits every row at once (one batch) and collects each row's output.
fn run(engine: &Engine, rows: &[Row]) -> Vec<Output> {
    let streams: Vec<_> = rows.iter().map(|r| engine.submit_channel(r.request.clone()).unwrap().1).collect();
    streams
        .iter()
        .map(|rx| {
            let mut out = Output { tokens: Vec::new(), text: String::new(), finish: None, error: None, logprobs: Vec::new() };
            loop {
                match rx.recv_timeout(std::time::Duration::from_secs(120)).expect("no event within 120 s") {
                    Event::Token { token_id, text, logprobs, .. } => {
                        out.tokens.push(token_id);
                        out.text.push_str(&text);
                        out.logprobs.extend(logprobs.as_ref().map(bits));
                    }
                    Event::Done { finish_reason, text, .. } => {
                        out.text.push_str(&text);
                        out.finish = Some(finish_reason);
                        return out;
                    }
                    Event::Started { .. } => {}
                    Event::Error { message } => {
                        out.error = Some(message);
                        return out;
                    }
                }
            }
        })
        .collect()
}

#[test]
fn a_mixed_batch_decodes_the_same_pipelined_and_synchronous() {
    let rows = rows();
    let config = || EngineConfig { max_batch: 16, prompt_concurrency: 16, ..Default::default() };
    let pipelined = {
        let engine = Engine::start(model_with_tokenizer(), config()).unwrap();
        run(&engine, &rows)
    };
    let synchronous = {
        let engine =
            Engine::start(model_with_tokenizer(), EngineConfig { decode: DecodeMode::Synchronous, ..config() }).unwrap();
        run(&engine, &rows)
    };
    for ((row, p), s) in rows.iter().zip(&pipelined).zip(&synchronous) {
        assert_eq!(p.error, None, "{}", row.what);
        assert_eq!(p, s, "{}: pipelined vs synchronous", row.what);
        if let Some(want) = &row.golden {
            assert_eq!(&p.tokens, want, "{}: vs mlx-lm", row.what);
        }
        if let Some(k) = row.request.logprobs {
            assert_eq!(p.logprobs.len(), p.tokens.len(), "{}: one log-probability per token", row.what);
            assert!(p.logprobs.iter().all(|(_, top)| top.len() == k), "{}", row.what);
        }
    }
    // The rows did what they were asked: sampled rows left the greedy path, constrained ones
    // match their constraint.
    let find = |what: &str| rows.iter().position(|r| r.what == what).unwrap();
    let c = &pipelined[find("constrained greedy")];
    let v: Value = serde_json::from_str(&c.text).unwrap_or_else(|e| panic!("{e}: {:?}", c.text));
    assert!(v["a"].is_i64() && v["b"].as_str().is_some_and(|b| b.chars().count() <= 6), "{v}");
    let r = &pipelined[find("constrained sampled")];
    assert!(regex::Regex::new("^[a-z]{4,30}$").unwrap().is_match(&r.text), "{:?}", r.text);
    let engine = Engine::start(model_with_tokenizer(), config()).unwrap();
    let sampled = find("sampled 0");
    let as_greedy = Request { sampling: SamplingParams::default(), ..rows[sampled].request.clone() };
    let greedy_out = run(&engine, &[Row { what: "greedy twin".into(), request: as_greedy, golden: None }]);
    assert_ne!(greedy_out[0].tokens, pipelined[sampled].tokens, "a sampled row decoded its greedy trajectory");
}

/// `generate()` (the CLI's `weft generate` / `weft run` path) honours the decode mode: pipelined
/// and synchronous single-sequence runs both reproduce mlx-lm's greedy trajectory.
#[test]
fn generate_runs_pipelined_and_synchronous_alike() {
    let model = support::load_exact(&tiny_model_dir(MODEL)).unwrap();
    let case = &golden(MODEL)["single"][0];
    let (prompt, want) = (ids(&case["prompt_ids"]), ids(&case["tokens"]));
    for decode in [DecodeMode::Pipelined, DecodeMode::Synchronous] {
        let opts = weft::generate::GenerateOptions { max_tokens: want.len(), decode, ..Default::default() };
        let g = weft::generate::generate(model.model.as_ref(), None, &prompt, &opts, |_| true).unwrap();
        assert_eq!(g.tokens, want, "{decode:?}");
    }
}
