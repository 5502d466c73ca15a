//! Request preparation: the checks, rendering, tokenization, media and constraints that turn a
//! [`Request`] into a [`Submission`] the core can queue.

use super::{scheduler, Constraint, EngineConfig, EventSink, Input, PreparedAudio, PreparedImage, Request, RequestId, RowFlow, Sink};
use super::prompt_cache;
use super::request::{check_draft_tokens, check_top_logprobs};
use crate::constrain::{ConstraintFactoryCell, RowConstraint};
use crate::models::ModelInfo;
use crate::reasoning::ReasoningPlan;
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// A validated, tokenized request ready for the core.
pub struct Submission {
    pub id: RequestId,
    pub prompt: Vec<u32>,
    pub request: Request,
    pub stop_token_ids: Vec<u32>,
    pub sink: EventSink,
    /// Set by [`Engine::submit_with_flow`].
    pub flow: Option<RowFlow>,
    /// The request's constraint, compiled for this model (from `request.constraint`).
    pub constraint: Option<RowConstraint>,
    /// The request's images, preprocessed ([`attach_images`]).
    pub images: Vec<PreparedImage>,
    /// The request's audio clips, as log-mel features ([`attach_audio`]).
    pub audio: Vec<PreparedAudio>,
    /// The model's reasoning for this row: set for a conversation whose template marks
    /// reasoning ([`crate::reasoning`]).
    pub reasoning: Option<ReasoningPlan>,
    /// The conversation as its template rendered it (what media expansion re-tokenizes).
    pub rendered: Option<String>,
    /// Prompt positions where the prompt cache snapshots the row while it prefills (chat
    /// boundaries the next turn shares; [`prompt_cache`]), ascending.
    pub checkpoints: Vec<usize>,
}

/// A request that passed every check that needs no tokenization ([`check_request`]): what is
/// left is rendering / tokenizing its prompt and the checks on the prompt's length
/// ([`finish_prepare`]).
pub struct CheckedRequest {
    request: Request,
    /// The prompt's ids, already checked, when the request gave token ids.
    prompt: Option<Vec<u32>>,
    /// The request's own constraint, compiled for this model.
    constraint: Option<RowConstraint>,
}

impl CheckedRequest {
    /// Whether [`finish_prepare`] still has a prompt to render or tokenize (text or messages);
    /// a token-id prompt is ready to queue.
    pub fn needs_tokenizing(&self) -> bool {
        self.prompt.is_none()
    }
}

/// The cheap half of [`prepare`]: field ranges, what needs a tokenizer or a chat template,
/// tool history, token-id prompts against the vocabulary, context and KV budget, and the
/// constraint (compiled here, so a bad schema is refused at once). A face may run this on its
/// caller's thread and leave [`finish_prepare`] (tokenization, chat-template rendering) to
/// another.
pub fn check_request(
    request: Request,
    tokenizer: Option<&Tokenizer>,
    constraints: &ConstraintFactoryCell,
    info: &ModelInfo,
    config: &EngineConfig,
) -> Result<CheckedRequest> {
    if let Some(n) = request.num_draft_tokens {
        check_draft_tokens(n)?;
    }
    let need_tokenizer = || {
        tokenizer.ok_or_else(|| Error::InvalidRequest("this model has no tokenizer; send token ids".into()))
    };
    let prompt = match (&request.input, &request.tools) {
        (Input::Messages(messages), tools) => {
            crate::tools::check_history(messages)?;
            let tokenizer = need_tokenizer()?;
            let template = request.chat_template.as_deref().or(config.chat_template.as_deref()).or(tokenizer.chat_template());
            match (tools, template) {
                (Some(_), None) => {
                    return Err(crate::tools::ToolsError::new("tools", "tools need a model with a chat template; this model has none").into())
                }
                (None, None) => return Err(Error::Tokenizer("this model has no chat template; pass a raw prompt".into())),
                _ => {}
            }
            None
        }
        // A caller that rendered the prompt itself (the server) has set the call syntax.
        (Input::Tokens(ids), Some(tools)) if tools.format.is_some() => Some(ids.clone()),
        (_, Some(_)) => {
            return Err(Error::InvalidRequest("tools need a conversation (messages), not a raw prompt or token ids".into()))
        }
        (Input::Tokens(ids), None) => Some(ids.clone()),
        (Input::Prompt(_), None) => {
            need_tokenizer()?;
            None
        }
    };
    if let Some(k) = request.logprobs {
        check_top_logprobs(k, "top_logprobs")?;
    }
    if request.max_tokens == 0 {
        return Err(Error::InvalidRequest("max_tokens must be at least 1".into()));
    }
    if !request.stop.is_empty() && tokenizer.is_none() {
        return Err(Error::InvalidRequest("stop strings need a model with a tokenizer".into()));
    }
    if let Some(prompt) = &prompt {
        check_prompt(&request, prompt, info, config)?;
    }
    request.sampling.validate(info.vocab_size as usize)?;
    let constraint = match &request.constraint {
        Some(c) => Some(compile_constraint(c, tokenizer, constraints)?),
        None => None,
    };
    Ok(CheckedRequest { request, prompt, constraint })
}

/// The prompt against the vocabulary, the context and the engine's whole KV budget.
pub(super) fn check_prompt(request: &Request, prompt: &[u32], info: &ModelInfo, config: &EngineConfig) -> Result<()> {
    crate::prefill::validate_prompt_ids(info, prompt)?;
    if let Some(budget) = config.kv_budget_bytes {
        let need = scheduler::projected_kv_bytes_for(info, config.kv_quantization().as_ref(), prompt.len(), request.max_tokens);
        if need > budget {
            return Err(Error::Capacity(format!(
                "this request needs {need} bytes of KV cache ({} prompt + {} max tokens), more than the \
                 engine's whole KV budget of {budget} bytes",
                prompt.len(),
                request.max_tokens
            )));
        }
    }
    Ok(())
}

fn compile_constraint(c: &Constraint, tokenizer: Option<&Tokenizer>, constraints: &ConstraintFactoryCell) -> Result<RowConstraint> {
    let tokenizer = tokenizer.ok_or_else(|| {
        Error::field(c.field(), format!("{}: constrained output needs a model with a tokenizer", c.field()))
    })?;
    // The constraint's own field names what a schema or grammar that does not compile is about.
    constraints.compile(c, tokenizer).map_err(|e| match e {
        Error::InvalidRequest(message) => Error::Field { key: c.field().to_string(), message },
        // A vocabulary the grammar engine cannot read refuses this request, not the model.
        Error::Unsupported(why) => Error::field(c.field(), format!("{}: this model's tokenizer cannot constrain output ({why})", c.field())),
        other => other,
    })
}

/// The costly half of [`prepare`]: renders the chat template (with tools) or tokenizes the
/// text, checks the prompt's length, and compiles a forced tool choice's grammar.
pub fn finish_prepare(
    id: RequestId,
    checked: CheckedRequest,
    sink: Sink,
    tokenizer: Option<&Tokenizer>,
    constraints: &ConstraintFactoryCell,
    info: &ModelInfo,
    eos_token_ids: &[u32],
    config: &EngineConfig,
) -> Result<Submission> {
    let CheckedRequest { mut request, prompt, mut constraint } = checked;
    let need_tokenizer = || {
        tokenizer.ok_or_else(|| Error::InvalidRequest("this model has no tokenizer; send token ids".into()))
    };
    let mut reasoning = None;
    let mut rendered = None;
    let mut checkpoints = Vec::new();
    let prompt = match prompt {
        Some(ids) => ids,
        None => {
            // The template: the request's override, the engine's, else the model's own.
            let override_template = request.chat_template.clone().or_else(|| config.chat_template.clone());
            request.chat_template = override_template.clone();
            let prompt = match &request.input {
                Input::Messages(messages) => {
                    let tokenizer = need_tokenizer()?;
                    let template = override_template.as_deref().or(tokenizer.chat_template()).ok_or_else(|| match request.tools {
                        Some(_) => Error::from(crate::tools::ToolsError::new(
                            "tools",
                            "tools need a model with a chat template; this model has none",
                        )),
                        None => Error::Tokenizer("this model has no chat template; pass a raw prompt".into()),
                    })?;
                    // The engine's template variables, then the request's, key by key.
                    let mut kwargs = config.chat_template_kwargs.clone();
                    kwargs.extend(request.chat_template_kwargs.iter().map(|(k, v)| (k.clone(), v.clone())));
                    let text = match &mut request.tools {
                        Some(tools) => crate::tools::render_with_tools(template, messages, tools, &kwargs)?,
                        None => template.render_with_kwargs(messages, None, true, &kwargs)?,
                    };
                    let budget = request.reasoning_budget.or(config.reasoning_budget);
                    reasoning = ReasoningPlan::for_prompt(template.source(), &text, budget);
                    let ids = tokenizer.encode(&text, false)?;
                    // Media expand the prompt later (positions move): no checkpoints then.
                    if config.prompt_cache_bytes > 0 && request.images.is_empty() && request.audio.is_empty() {
                        checkpoints = prompt_cache::chat_checkpoints(template, messages, request.tools.as_ref(), &kwargs, tokenizer, &ids);
                    }
                    rendered = Some(text);
                    ids
                }
                Input::Prompt(text) => need_tokenizer()?.encode(text, true)?,
                Input::Tokens(ids) => ids.clone(),
            };
            check_prompt(&request, &prompt, info, config)?;
            prompt
        }
    };
    // Tool calls are enforced with their grammar (known once the call syntax is): forced from
    // the start for required / named, from the call opener on for auto (which gives way to
    // the caller's own constraint).
    let factory = || tokenizer.and_then(|t| constraints.get_or_build(t).ok());
    let special = |text: &str| factory().and_then(|f| f.special_token(text));
    if let Some(grammar) = request.tools.as_ref().and_then(|t| t.grammar(&special)) {
        match (&request.constraint, &grammar) {
            (None, _) => {
                constraint = Some(compile_constraint(&grammar, tokenizer, constraints)?);
                request.constraint = Some(grammar);
            }
            (Some(_), Constraint::Triggered(_)) => {}
            (Some(other), _) => {
                return Err(Error::InvalidRequest(format!(
                    "tool_choice: a required or named tool call cannot be combined with {}",
                    other.field()
                )))
            }
        }
    }
    let stop_token_ids = if request.ignore_eos { Vec::new() } else { eos_token_ids.to_vec() };
    Ok(Submission {
        id,
        prompt,
        request,
        stop_token_ids,
        sink: EventSink::new(sink),
        flow: None,
        constraint,
        images: Vec::new(),
        audio: Vec::new(),
        reasoning,
        rendered,
        checkpoints,
    })
}

/// Turns a request into token ids and checks it against the model and the engine's limits
/// ([`check_request`], then [`finish_prepare`]).
pub fn prepare(
    id: RequestId,
    request: Request,
    sink: Sink,
    tokenizer: Option<&Tokenizer>,
    constraints: &ConstraintFactoryCell,
    info: &ModelInfo,
    eos_token_ids: &[u32],
    config: &EngineConfig,
) -> Result<Submission> {
    let checked = check_request(request, tokenizer, constraints, info, config)?;
    finish_prepare(id, checked, sink, tokenizer, constraints, info, eos_token_ids, config)
}
