/* The `weft` package: Weft's LLM engine for Node.js, Electron and Bun. */

/** What kind of failure a {@link WeftError} is. */
export type WeftErrorCode =
  /** An option has the wrong type or value, an unknown option, or a request the model cannot serve. */
  | 'INVALID_ARGUMENT'
  /** The request can never fit the engine's limits (e.g. more KV than the whole budget). */
  | 'CAPACITY'
  /** The model is missing, unreadable, inconsistent, or could not be downloaded or verified. */
  | 'MODEL_LOAD'
  /** The model uses an architecture or option Weft does not implement. */
  | 'UNSUPPORTED'
  /** A model download was cancelled through `Engine.load`'s `signal`. */
  | 'CANCELLED'
  /** The engine was closed. */
  | 'ENGINE_CLOSED'
  /** The engine's thread failed (a bug): every request got an error; load a new engine. */
  | 'ENGINE_FAILED'
  /** A request failed while generating (its stream or `complete` promise reports it). */
  | 'GENERATION_FAILED'
  /** A failure inside the engine or MLX. */
  | 'INTERNAL'
  /** No such thing: a prompt-cache file that does not exist, nothing cached to save. */
  | 'NOT_FOUND'

/** Every error the Weft API throws or rejects with. */
export declare class WeftError extends Error {
  constructor(message: string, code: WeftErrorCode)
  readonly name: 'WeftError'
  readonly code: WeftErrorCode
}

export interface Generation {
  [Symbol.asyncIterator](): Generation
}

/**
 * A loaded model served by a continuous-batching engine. Create one with {@link Engine.load};
 * concurrent `generate` / `complete` calls share its batch.
 */
export declare class Engine {
  /**
   * Loads a model (on a worker thread) and starts its engine.
   * Invalid options reject with a `WeftError` (`INVALID_ARGUMENT`), a model that cannot be
   * loaded with `MODEL_LOAD`, `UNSUPPORTED`, `DOWNLOAD`...
   */
  static load(options?: LoadOptions): Promise<Engine>
  /** What was loaded. */
  get modelInfo(): ModelInfo
  /** Whether {@link Engine.close} was called. */
  get closed(): boolean
  /**
   * Starts a request and returns its token stream: `for await (const chunk of
   * engine.generate(...))`. Invalid options throw a `WeftError` here, synchronously.
   * Leaving the loop early (`break`, `return`, an exception) cancels the request.
   */
  generate(options: GenerateOptions): Generation
  /**
   * Runs a request to the end and resolves with its text, token ids, finish reason and
   * usage. Invalid options reject with a `WeftError`.
   */
  complete(options: GenerateOptions): Promise<Completion>
  /** Scheduler state and counters (published after each engine step). */
  stats(): EngineStats
  /**
   * Saves one prompt-cache entry to the file at `path`, so a fixed preamble is prefilled
   * once, ever (load it into a later engine with {@link Engine.loadPromptCache}). Without
   * `prompt` the most recently used entry (after a request, its prompt and answer); with it
   * (the input of a `generate` call: `messages` with `tools`, `prompt` or `promptIds`) the
   * cached prefix a request with that input would reuse. Rejects with `NOT_FOUND` when the
   * cache holds nothing for it, `UNSUPPORTED` when the prompt cache is off.
   */
  savePromptCache(path: string, prompt?: GenerateOptions): Promise<PromptCacheEntry>
  /**
   * Loads an entry {@link Engine.savePromptCache} wrote into this engine's prompt cache:
   * later requests whose prompts start with its tokens reuse it, with outputs equal to a
   * cold run's. A file saved for another model, tokenizer or kernel mode, or truncated or
   * corrupt, rejects with `INVALID_ARGUMENT` saying why; a missing file with `NOT_FOUND`.
   */
  loadPromptCache(path: string): Promise<PromptCacheEntry>
  /**
   * Cancels every outstanding request (their streams end with `finishReason: "cancelled"`),
   * stops the engine thread and frees the model. Later calls are rejected with
   * `ENGINE_CLOSED`; closing twice is harmless.
   */
  close(): Promise<void>
}

/**
 * The token stream of one `generate` call: an async iterator of {@link Chunk}s. Tokens are
 * buffered per request (never blocking the engine), so a slow consumer only delays itself.
 */
export declare class Generation {
  /**
   * The next chunk: `{ done: false, value: chunk }`, then once `{ done: true, value:
   * summary }`. A failure mid-stream rejects with a `WeftError` (code `GENERATION_FAILED`).
   */
  next(): Promise<IteratorResult<Chunk, Completion | undefined>>
  /**
   * Stops the stream (what `break` in `for await` calls): cancels the request, drops
   * buffered chunks and resolves once the engine has released the row.
   */
  return(value?: unknown): Promise<IteratorResult<Chunk, Completion | undefined>>
  /**
   * Cancels the request; chunks already produced can still be read, then the stream ends with
   * `finishReason: "cancelled"`.
   */
  cancel(): void
  /**
   * Text, token ids, finish reason and usage once the engine has finished the request (chunks
   * may still be buffered for the iterator), else `null`.
   */
  get summary(): Completion | null
}

/** One turn of a conversation. */
export interface ChatMessage {
  /** `"system"`, `"user"`, `"assistant"`, `"tool"`... as the model's chat template expects. */
  role: string
  /** May be `null` on an assistant turn that only calls tools. */
  content?: string | null
  /**
   * An assistant turn's calls, in OpenAI's shape (a {@link ToolCall} `c` is `{ id: c.id,
   * type: 'function', function: { name: c.name, arguments: c.arguments } }`).
   */
  toolCalls?: Array<{ id: string; type: 'function'; function: { name: string; arguments: string | Record<string, unknown> } }>
  /** A `tool` turn: the id of the call it answers. */
  toolCallId?: string
  /** A `tool` turn: the function's name (optional). */
  name?: string
  /** An assistant turn's reasoning, for templates that show it in history. */
  reasoningContent?: string
}

/** One streamed piece of output. */
export interface Chunk {
  /**
   * Text this token completes (may be empty while a multi-byte character or a possible stop
   * string is held back).
   */
  text: string
  /**
   * The reasoning ("thinking") text this token completes, for a model whose template marks
   * reasoning: kept apart from `text`, markers removed. Absent when there is none.
   */
  reasoning?: string
  /**
   * The generated token; absent on a last chunk that only carries text held back when the
   * request ended.
   */
  tokenId?: number
  /**
   * With `logprobs: true`: the token's natural-log probability (after logit bias and
   * penalties, before temperature). Absent otherwise and on a held-back-text chunk.
   */
  logprob?: number
  /**
   * With `logprobs: true`: the `topLogprobs` most likely tokens at this step, best first
   * (empty when `topLogprobs` is 0).
   */
  topLogprobs?: Array<TokenLogprob>
  /**
   * With `tools`: the pieces of tool calls this chunk adds, in order (a call's text is never
   * in `text`). Absent when there are none. Assembling every chunk's pieces gives the
   * completion's `toolCalls`.
   */
  toolCalls?: Array<ToolCallDelta>
}

/** The result of {@link Engine.complete}, and {@link Generation.summary} once a stream ended. */
export interface Completion {
  text: string
  /**
   * The model's reasoning, apart from `text` (absent for a model without reasoning or when
   * it reasoned nothing).
   */
  reasoning?: string
  /** Generated token ids (an end-of-sequence token that stopped generation is not included). */
  tokenIds: Array<number>
  finishReason: FinishReason
  usage: Usage
  /** With `logprobs: true`: one entry per generated token, in the order of `tokenIds`. */
  logprobs?: Array<TokenLogprobs>
  /**
   * With `tools`: every call the output made, complete (empty when it made none; a call the
   * output did not finish is not delivered).
   */
  toolCalls?: Array<ToolCall>
}

/** One report of a model download, as {@link LoadOptions.onProgress} receives it. */
export interface DownloadProgress {
  /**
   * `waiting` (another process is downloading the same file), `downloading`, `verifying`
   * (hashing a local file), `extracting` (unpacking the default model), `done` (once, at the end).
   */
  phase: 'waiting' | 'downloading' | 'verifying' | 'extracting' | 'done'
  /** Bytes done in this phase (a repo's small files, then its weights, each count from 0). */
  downloaded: number
  /** Bytes the phase will reach, when known. */
  total?: number
}

/** A snapshot of the engine's scheduler and counters. */
export interface EngineStats {
  activeRows: number
  queuedRows: number
  prefillingRows: number
  kvBytesInUse: number
  /** Absent when there is no KV budget. */
  kvBudgetBytes?: number
  promptCacheBytes: number
  promptCacheEntries: number
  promptCacheHits: number
  /** Prompt tokens served from the prompt cache (summed over its hits). */
  promptCacheCachedTokens: number
  /** The most the prompt cache holds (0: off). */
  promptCacheCapacityBytes: number
  /** Entries dropped to stay under the capacity or to make room for running requests. */
  promptCacheEvictions: number
  /** Files of `promptCacheDir` refused at load, each with why. */
  promptCacheFilesRefused: Array<string>
  tokensGenerated: number
  decodeSteps: number
  requestsFinished: number
  /** Rows parked because their stream went unread (see `generate`). */
  pausedRows: number
  /** Speculative decoding (`numDraftTokens`): draft tokens verified and accepted. */
  draftTokens: number
  draftTokensAccepted: number
}

/**
 * Why a request ended: `"stop"` (an end-of-sequence token, a stop string or a complete
 * constraint), `"length"` (`maxTokens` or the model's context length), `"cancelled"`
 * (`break`, `return()`, `cancel()`, an aborted signal or `close()`) or `"tool_calls"` (a
 * request with `tools` stopped after making calls).
 */
export type FinishReason = 'stop' | 'length' | 'cancelled' | 'tool_calls'

/**
 * Options for {@link Engine.generate} and {@link Engine.complete}. Exactly one of `messages`,
 * `prompt` or `promptIds` is required.
 */
export interface GenerateOptions {
  /** A conversation, rendered with the model's chat template. */
  messages?: Array<ChatMessage>
  /** Raw text, tokenized as is. */
  prompt?: string
  /** Token ids. */
  promptIds?: Array<number>
  /** Most tokens to generate (default 256). */
  maxTokens?: number
  /** 0 (the default) is greedy. */
  temperature?: number
  /** Nucleus sampling threshold in (0, 1]; 1 (default) disables. */
  topP?: number
  /** Keep the k most likely tokens; 0 (default) disables. */
  topK?: number
  /** Drop tokens below `minP × p(top token)`; 0 (default) disables. */
  minP?: number
  repetitionPenalty?: number
  presencePenalty?: number
  frequencyPenalty?: number
  /** How many recent tokens the penalties look at (default 20). */
  penaltyContext?: number
  /** Additive bias per token id; `-Infinity` bans a token. */
  logitBias?: Record<number, number>
  /** Makes sampling reproducible. */
  seed?: number
  /** Stop strings: generation ends before the first match, which is cut from the text. */
  stop?: string | string[]
  /** Keep going past the model's end-of-sequence tokens. */
  ignoreEos?: boolean
  /** Report each generated token's log-probability (`Chunk.logprob`, `Completion.logprobs`). */
  logprobs?: boolean
  /** Also report this many most likely alternatives per token (0 to 20; needs `logprobs`). */
  topLogprobs?: number
  /**
   * Constrains the output, OpenAI's shape: `{ type: 'json_object' }`, or `{ type:
   * 'json_schema', json_schema: { name, schema, strict } }`; `{ type: 'text' }` is none.
   * At most one of `responseFormat`, `jsonSchema`, `regex`, `grammar`, `choice`.
   */
  responseFormat?: { type: 'text' | 'json_object' } | { type: 'json_schema'; json_schema: { name: string; schema?: Record<string, unknown> | boolean; strict?: boolean; description?: string } }
  /** A JSON schema the output must validate against. */
  jsonSchema?: Record<string, unknown> | boolean
  /** A regular expression the whole output must match. */
  regex?: string
  /** A grammar in llguidance's Lark syntax (may embed `%json {schema}`). */
  grammar?: string
  /** The output is exactly one of these strings. */
  choice?: Array<string>
  /**
   * Tools the model may call; its calls arrive as `toolCalls` in chunks and the completion
   * (docs/tools.md). Needs `messages`.
   */
  tools?: Array<Tool>
  /**
   * `'auto'` (default), `'none'`, `'required'` (a call is forced) or a named function
   * (`{ type: 'function', function: { name } }`, forced); forced calls are grammar-constrained.
   */
  toolChoice?: 'auto' | 'none' | 'required' | { type: 'function'; function: { name: string } }
  /** `false` ends generation after the first complete call (default `true`). */
  parallelToolCalls?: boolean
  /**
   * Variables for the chat template, over the engine's (`{ enable_thinking: false }` turns a
   * reasoning model's thinking off).
   */
  chatTemplateKwargs?: Record<string, unknown>
  /**
   * Reasoning tokens the model may spend before its reasoning block is closed for it and the
   * answer begins (`Chunk.reasoning`); default: the engine's, else unbounded.
   */
  reasoningBudget?: number
  /**
   * Prompt-lookup speculative decoding: draft up to this many tokens per step, 0 to 64 (0:
   * off); default: the engine's `numDraftTokens`. Greedy output is unchanged, sampled output
   * keeps its distribution.
   */
  numDraftTokens?: number
  /**
   * Images for a model with a vision tower (`modelInfo.vision`), in prompt order: a file's
   * bytes (`Uint8Array` / `Buffer`), a local file path or a `data:` URL. The prompt holds the
   * model's image marker once per image (docs/node.md).
   */
  images?: Array<Uint8Array | string>
  /**
   * Audio clips (WAV / MP3 / FLAC / Ogg, at most 30 s each) for a model with an audio tower
   * (`modelInfo.audio`), in prompt order, as `images`. The prompt holds the model's audio
   * token once per clip.
   */
  audio?: Array<Uint8Array | string>
  /**
   * Aborting it cancels the request in the engine; the stream then ends normally with
   * `finishReason: "cancelled"` (nothing is thrown).
   */
  signal?: AbortSignal
}

/** Options for {@link Engine.load}. */
export interface LoadOptions {
  /**
   * An mlx-lm model directory or a `.gguf` file, or a Hugging Face repo id
   * (`org/repo[@revision][:file]`, fetched into the Hugging Face cache; see `onProgress`).
   * Omitted: the default model (SmolLM2-135M-Instruct), downloaded and verified on first use.
   */
  model?: string
  /**
   * CPU kernels of this engine's model: `'fast'` (Weft's) or `'exact'` (MLX's own, bit for bit
   * mlx-lm). Omitted: `WEFT_CPU_KERNELS` if set, else fast. Engines in one process may differ.
   */
  cpuKernels?: 'fast' | 'exact'
  /**
   * What fast mode's quantized matmul multiplies the weights with below 16 rows (decode):
   * `'int8'` (llama.cpp-style activations, as close to exact mode as llama.cpp) or `'float'`
   * (slower, closer). Omitted: `WEFT_CPU_ACTIVATIONS` if set, else int8.
   */
  cpuActivations?: 'float' | 'int8'
  /**
   * GGUF block types MLX's reader lacks: `'native'` (kept quantized) or `'dequantize'` (all
   * float32). Omitted: `WEFT_GGUF_WEIGHTS` if set, else native.
   */
  ggufWeights?: 'native' | 'dequantize'
  /** Rows decoding together (default 8). */
  maxBatch?: number
  /** Requests admitted to prefill at once (default 8). */
  promptConcurrency?: number
  /** Prompt tokens per prefill chunk; decode steps interleave between chunks (default 2048). */
  prefillStepSize?: number
  /** Projected KV-cache bytes allowed across admitted rows (default: no limit). */
  kvBudgetBytes?: number
  /**
   * Bytes of KV kept for prompt-prefix reuse, finished rows and their chat-boundary
   * checkpoints (0: off; default: sized from the memory left after loading the model).
   */
  promptCacheBytes?: number
  /**
   * Store keys and values affine-quantized to this many bits (2, 3, 4, 5, 6 or 8). Default:
   * full precision, the mode that matches mlx-lm token for token.
   */
  kvBits?: number
  /** Elements per KV quantization group: 32, 64 (default) or 128; must divide the head size. */
  kvGroupSize?: number
  /** Positions a row holds in full precision before its KV is quantized (default 0). */
  quantizedKvStart?: number
  /** Largest buffer cache (freed buffers kept for reuse) MLX keeps (default: MLX's). */
  cacheLimitBytes?: number
  /** Return MLX's buffer cache every this many decode steps (default 256; 0: only when idle). */
  clearCacheEverySteps?: number
  /** MLX's memory limit, >= 1 (default: MLX's). */
  memoryLimitBytes?: number
  /** Memory MLX may keep wired on Apple GPUs; ignored elsewhere (default: MLX's). */
  wiredLimitBytes?: number
  /**
   * Which local files requests may name as images / audio: `'any'` (default), `'deny'`, or
   * `{ dirs: [...] }` (files under these directories only).
   */
  localMedia?: 'any' | 'deny' | { dirs: string[] }
  /** Chat-template variables every request starts from (e.g. `{ enable_thinking: false }`). */
  chatTemplateKwargs?: Record<string, unknown>
  /** Reasoning tokens allowed when a request names no `reasoningBudget` (default: unbounded). */
  reasoningBudget?: number
  /**
   * Prompt-lookup speculative decoding for requests that name no `numDraftTokens`: draft up
   * to this many tokens per step, 0 to 64 (default 0: off).
   */
  numDraftTokens?: number
  /**
   * Draft model for speculative decoding (a local model path sharing the tokenizer): drafts
   * `numDraftTokens` tokens per step (default 3) instead of prompt lookup.
   */
  draftModel?: string
  /**
   * Hears about the model's download, on the JS thread, at most every ~100 ms per phase plus
   * once when a phase starts and ends (nothing when the model is already on disk). The load
   * waits for each call, so every report arrives before the promise settles.
   */
  onProgress?: (progress: DownloadProgress) => void
  /**
   * Aborting it cancels a Hugging Face download: the promise rejects with a `WeftError` of
   * code `CANCELLED`; what was received stays in the cache's `.incomplete` file (never under a
   * name that loads) and a later load resumes it.
   */
  signal?: AbortSignal
}

export interface ModelInfo {
  /** The resolved model path. */
  path: string
  /** `config.json`'s `model_type` (`llama`, `qwen3`...). */
  modelType: string
  vocabSize: number
  numLayers: number
  /** Longest context the model was trained for, when its config says. */
  contextLength?: number
  /** Whether the model has a tokenizer (else only `promptIds` work). */
  hasTokenizer: boolean
  /** The model takes images (`images`): it has a vision tower Weft runs. */
  vision: boolean
  /** The model takes audio (`audio`): it has an audio tower Weft runs. */
  audio: boolean
}

/** A prompt-cache entry written by `savePromptCache` or read by `loadPromptCache`. */
export interface PromptCacheEntry {
  /** The tokens the entry holds. */
  tokens: number
  /** The file's size. */
  bytes: number
}

/** One of the most likely tokens at a step. */
export interface TokenLogprob {
  tokenId: number
  /** Natural-log probability. */
  logprob: number
}

/** A generated token's log-probability and the most likely alternatives at its step. */
export interface TokenLogprobs {
  tokenId: number
  logprob: number
  /** Best first; empty when `topLogprobs` is 0. */
  topLogprobs: Array<TokenLogprob>
}

/** A tool the model may call (OpenAI's function shape). */
export interface Tool {
  type: 'function'
  function: { name: string; description?: string; parameters?: Record<string, unknown> }
}

/** A complete tool call. */
export interface ToolCall {
  id: string
  name: string
  /** The arguments as JSON text (an object; `JSON.parse` it). */
  arguments: string
}

/**
 * A streamed piece of a tool call, as OpenAI streams `delta.tool_calls`: the first piece of a
 * call has its `id` and `name`; later pieces carry `arguments` fragments whose concatenation
 * is the call's arguments JSON text.
 */
export interface ToolCallDelta {
  /** Which call of the output (0-based, in the order the model wrote them). */
  index: number
  /** The call's id (`call_` + 24 letters or digits), on its first piece. */
  id?: string
  /** The function's name, on the call's first piece. */
  name?: string
  /** The next fragment of the arguments' JSON text. */
  arguments?: string
}

export interface Usage {
  promptTokens: number
  completionTokens: number
  /** Prompt tokens whose KV came from the prompt cache. */
  cachedTokens: number
  /** Completion tokens spent reasoning (the reasoning block and its markers). */
  reasoningTokens: number
}
