//! Request preparation: the checks, rendering, tokenization, media and constraints that turn a
//! [`Request`] into a [`Submission`] the core can queue, in one [`Preparer`] every face shares.

use super::media::{attach_audio, attach_images};
use super::{lockstep, prompt_cache, scheduler};
use super::{Constraint, EngineConfig, EventSink, Input, PreparedAudio, PreparedImage, Request, RequestId, RowFlow, Sink};
use super::request::{check_draft_tokens, check_top_logprobs};
use crate::audio::AudioSpec;
use crate::constrain::{ConstraintFactoryCell, RowConstraint};
use crate::loading::LoadedModel;
use crate::models::ModelInfo;
use crate::reasoning::ReasoningPlan;
use crate::tokenizer::Tokenizer;
use crate::vision::ImageSpec;
use crate::{Error, Result};

/// A validated, tokenized request ready for the core, its media attached ([`Preparer::prepare`]).
pub struct Submission {
    pub id: RequestId,
    pub prompt: Vec<u32>,
    pub request: Request,
    pub stop_token_ids: Vec<u32>,
    pub sink: EventSink,
    /// Set by [`super::Engine::submit_with_flow`].
    pub flow: Option<RowFlow>,
    /// The request's constraint, compiled for this model (from `request.constraint`).
    pub constraint: Option<RowConstraint>,
    /// The request's images, preprocessed.
    pub images: Vec<PreparedImage>,
    /// The request's audio clips, as log-mel features.
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

/// A request that passed every check that needs no tokenization ([`Preparer::check`]): what is
/// left is rendering / tokenizing its prompt, the checks on the prompt's length and its media
/// ([`Preparer::prepare`]).
pub struct CheckedRequest {
    request: Request,
    /// The prompt's ids, already checked, when the request gave token ids.
    prompt: Option<Vec<u32>>,
    /// The request's own constraint, compiled for this model.
    constraint: Option<RowConstraint>,
}

impl CheckedRequest {
    /// Whether [`Preparer::prepare`] still has a prompt to render or tokenize (text or
    /// messages); a token-id prompt is ready to queue.
    pub fn needs_tokenizing(&self) -> bool {
        self.prompt.is_none()
    }
}

/// Turns requests into [`Submission`]s for one model and engine configuration: what that needs
/// (tokenizer, grammar compiler, model limits, end-of-sequence ids, image and audio contracts,
/// the engine's settings) is taken once, at start. The [`super::Engine`], tools driving an
/// [`super::EngineCore`] directly and prompt counting all prepare through it.
#[derive(Clone)]
pub struct Preparer {
    tokenizer: Option<Tokenizer>,
    /// The grammar compiler of `tokenizer`, shared with the model it came from.
    constraints: ConstraintFactoryCell,
    info: ModelInfo,
    eos_token_ids: Vec<u32>,
    /// The model's image contract, when it has a vision tower.
    vision: Option<ImageSpec>,
    /// The model's audio contract, when it has an audio tower.
    audio: Option<AudioSpec>,
    config: EngineConfig,
    /// Chat requests carry their chat-boundary checkpoints ([`Submission::checkpoints`]): the
    /// prompt cache is on and the model has caches that cannot be cut back to an earlier
    /// position (recurrent state, a sliding-window ring), the models whose executor snapshots
    /// rows at them. Finding them renders and tokenizes the conversation up to twice more, so
    /// it is not done for anything else.
    checkpointing: bool,
    /// Steps run across ranks: refuse at submit what the ranks cannot reproduce.
    lockstep: bool,
}

/// The limits a prompt's length is held to: the model's context and the engine's KV budget
/// (the same model info and config as the preparer's, or relaxed ones for a count).
#[derive(Clone, Copy)]
pub(super) struct Limits<'a> {
    info: &'a ModelInfo,
    config: &'a EngineConfig,
}

impl Preparer {
    /// For `model` served under `config`.
    pub fn new(model: &LoadedModel, config: EngineConfig) -> Self {
        // As the executor decides whether it snapshots rows at their checkpoints.
        let checkpointing = config.prompt_cache_bytes > 0 && model.model.make_caches().iter().any(|c| !c.always_trims());
        Preparer {
            tokenizer: model.tokenizer.clone(),
            constraints: model.constraints.clone(),
            info: model.model.info().clone(),
            eos_token_ids: model.eos_token_ids.clone(),
            vision: model.model.vision().map(|v| v.spec().clone()),
            audio: model.model.audio().map(|a| a.spec().clone()),
            config,
            checkpointing,
            lockstep: false,
        }
    }

    /// For rank 0 of a rank group: requests the ranks cannot reproduce (media) are refused, and
    /// no checkpoints are found (followers prefill in rank 0's chunks and never learn them).
    pub fn for_lockstep(mut self) -> Self {
        self.lockstep = true;
        self.checkpointing = false;
        self
    }

    /// Rows stop at these ids instead of the model's end-of-sequence ids (none: only
    /// `max_tokens`, stop strings or a constraint end them).
    pub fn with_eos_token_ids(mut self, ids: Vec<u32>) -> Self {
        self.eos_token_ids = ids;
        self
    }

    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.tokenizer.as_ref()
    }

    pub fn model_info(&self) -> &ModelInfo {
        &self.info
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// The model's image contract (`None`: a text-only model).
    pub fn vision(&self) -> Option<&ImageSpec> {
        self.vision.as_ref()
    }

    /// The model's audio contract (`None`: a model without an audio tower).
    pub fn audio(&self) -> Option<&AudioSpec> {
        self.audio.as_ref()
    }

    /// Whether prepared chat requests carry chat-boundary checkpoints (see the field).
    pub fn checkpointing(&self) -> bool {
        self.checkpointing
    }

    fn limits(&self) -> Limits<'_> {
        Limits { info: &self.info, config: &self.config }
    }

    /// The cheap half of preparing: field ranges, what needs a tokenizer or a chat template,
    /// tool history, token-id prompts against the vocabulary, context and KV budget, and the
    /// constraint (compiled here, so a bad schema is refused at once). A face may run this on
    /// its caller's thread and leave [`Preparer::prepare`] (tokenization, chat-template
    /// rendering, media) to another.
    /// Whether requests are refused what the ranks of a group cannot reproduce.
    pub fn is_lockstep(&self) -> bool {
        self.lockstep
    }

    pub fn check(&self, request: Request) -> Result<CheckedRequest> {
        self.check_within(request, self.limits())
    }

    /// The costly half: renders the chat template (with tools) or tokenizes the text, checks
    /// the prompt's length, compiles a forced tool choice's grammar, and attaches the
    /// request's images and audio (decoded and preprocessed here, on the caller's thread; the
    /// prompt's markers expanded).
    pub fn prepare(&self, id: RequestId, checked: CheckedRequest, sink: Sink) -> Result<Submission> {
        self.prepare_within(id, checked, sink, self.limits(), self.checkpointing)
    }

    /// [`Preparer::check`], then [`Preparer::prepare`].
    pub fn submission(&self, id: RequestId, request: Request, sink: Sink) -> Result<Submission> {
        let checked = self.check(request)?;
        self.prepare(id, checked, sink)
    }

    /// The number of prompt tokens `request` would prefill, prepared as a submission is. A
    /// prompt longer than the model's context or the engine's KV budget is still counted (a
    /// count is how a client learns it must shorten the prompt); every other problem with the
    /// request is the error a submit would give.
    pub fn count(&self, request: Request) -> Result<usize> {
        // The length checks are what a count reports, not a reason to refuse one.
        let info = ModelInfo { max_position_embeddings: None, ..self.info.clone() };
        let config = EngineConfig { kv_budget_bytes: None, ..self.config.clone() };
        let limits = Limits { info: &info, config: &config };
        let checked = self.check_within(request, limits)?;
        Ok(self.unqueued_prompt(checked, limits)?.len())
    }

    /// The token ids a checked request would prefill (rendered and tokenized as
    /// [`Preparer::prepare`] does, without chat-boundary checkpoints).
    pub fn prompt_ids(&self, checked: CheckedRequest) -> Result<Vec<u32>> {
        self.unqueued_prompt(checked, self.limits())
    }

    /// The prompt of a submission prepared only to be looked at, without checkpoints.
    fn unqueued_prompt(&self, checked: CheckedRequest, limits: Limits<'_>) -> Result<Vec<u32>> {
        let mut sub = self.prepare_within(0, checked, Box::new(|_: &super::Event| false), limits, false)?;
        // Never queued: its sink gets no events.
        sub.sink.discard();
        Ok(std::mem::take(&mut sub.prompt))
    }

    fn check_within(&self, request: Request, limits: Limits<'_>) -> Result<CheckedRequest> {
        let info = limits.info;
        if self.lockstep {
            lockstep::check_request(&request)?;
        }
        if let Some(n) = request.num_draft_tokens {
            check_draft_tokens(n)?;
        }
        let tokenizer = self.tokenizer.as_ref();
        let need_tokenizer = || {
            tokenizer.ok_or_else(|| Error::InvalidRequest("this model has no tokenizer; send token ids".into()))
        };
        let prompt = match (&request.input, &request.tools) {
            (Input::Messages(messages), tools) => {
                crate::tools::check_history(messages)?;
                let tokenizer = need_tokenizer()?;
                let template = request.chat_template.as_deref().or(self.config.chat_template.as_deref()).or(tokenizer.chat_template());
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
            check_prompt(&request, prompt, limits)?;
        }
        request.sampling.validate(info.vocab_size as usize)?;
        let constraint = match &request.constraint {
            Some(c) => Some(compile_constraint(c, tokenizer, &self.constraints)?),
            None => None,
        };
        Ok(CheckedRequest { request, prompt, constraint })
    }

    fn prepare_within(&self, id: RequestId, checked: CheckedRequest, sink: Sink, limits: Limits<'_>, checkpointing: bool) -> Result<Submission> {
        let info = limits.info;
        let CheckedRequest { mut request, prompt, mut constraint } = checked;
        let tokenizer = self.tokenizer.as_ref();
        let need_tokenizer = || {
            tokenizer.ok_or_else(|| Error::InvalidRequest("this model has no tokenizer; send token ids".into()))
        };
        let config = &self.config;
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
                        if checkpointing && request.images.is_empty() && request.audio.is_empty() {
                            checkpoints = prompt_cache::chat_checkpoints(template, messages, request.tools.as_ref(), &kwargs, tokenizer, &ids);
                        }
                        rendered = Some(text);
                        ids
                    }
                    Input::Prompt(text) => need_tokenizer()?.encode(text, true)?,
                    Input::Tokens(ids) => ids.clone(),
                };
                check_prompt(&request, &prompt, limits)?;
                prompt
            }
        };
        // Tool calls are enforced with their grammar (known once the call syntax is): forced from
        // the start for required / named, from the call opener on for auto (which gives way to
        // the caller's own constraint).
        let factory = || tokenizer.and_then(|t| self.constraints.get_or_build(t).ok());
        let special = |text: &str| factory().and_then(|f| f.special_token(text));
        if let Some(grammar) = request.tools.as_ref().and_then(|t| t.grammar(&special)) {
            match (&request.constraint, &grammar) {
                (None, _) => {
                    constraint = Some(compile_constraint(&grammar, tokenizer, &self.constraints)?);
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
        let stop_token_ids = if request.ignore_eos { Vec::new() } else { self.eos_token_ids.clone() };
        let mut sub = Submission {
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
        };
        attach_images(&mut sub, self.vision.as_ref(), tokenizer, info)?;
        attach_audio(&mut sub, self.audio.as_ref(), limits)?;
        Ok(sub)
    }
}

/// The prompt against the vocabulary, the context and the engine's whole KV budget.
pub(super) fn check_prompt(request: &Request, prompt: &[u32], limits: Limits<'_>) -> Result<()> {
    let (info, config) = (limits.info, limits.config);
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

