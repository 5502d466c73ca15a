import Foundation

/// An error from Weft: a stable `code` to branch on and a human-readable `message`.
public struct WeftError: Error, Sendable, Equatable, CustomStringConvertible {
    public struct Code: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
        public let rawValue: String
        public init(rawValue: String) { self.rawValue = rawValue }
        public var description: String { rawValue }

        /// A bad option or request (out of range, empty prompt, unknown token id...).
        public static let invalidArgument = Code(rawValue: "INVALID_ARGUMENT")
        /// The model could not be loaded (missing files, bad config or weights, a failed
        /// download or verification).
        public static let modelLoad = Code(rawValue: "MODEL_LOAD")
        /// An architecture or quantization Weft does not support.
        public static let unsupported = Code(rawValue: "UNSUPPORTED")
        /// The request can never fit the engine's KV budget.
        public static let capacity = Code(rawValue: "CAPACITY")
        /// A model download was cancelled (by the progress handler or the loading task).
        public static let cancelled = Code(rawValue: "CANCELLED")
        /// The engine was closed.
        public static let engineClosed = Code(rawValue: "ENGINE_CLOSED")
        /// The engine's thread failed (a bug): every request got an error; create a new engine.
        public static let engineFailed = Code(rawValue: "ENGINE_FAILED")
        /// A failure inside the engine or MLX.
        public static let internalError = Code(rawValue: "INTERNAL")
        /// The engine failed while generating (the stream ends with this error).
        public static let generationFailed = Code(rawValue: "GENERATION_FAILED")
        /// No such thing: a prompt-cache file that does not exist, nothing cached to save.
        public static let notFound = Code(rawValue: "NOT_FOUND")
    }

    public let code: Code
    public let message: String

    public init(code: Code, message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { "WeftError(\(code)): \(message)" }

    static func invalid(_ message: String) -> WeftError {
        WeftError(code: .invalidArgument, message: message)
    }
}

/// One turn of a conversation, rendered with the model's chat template.
public struct Message: Sendable, Equatable {
    /// `"system"`, `"user"`, `"assistant"`, `"tool"`... as the model's chat template expects.
    public var role: String
    public var content: String
    /// An assistant turn's tool calls (e.g. a previous `Completion.toolCalls`).
    public var toolCalls: [ToolCall]
    /// A `tool` turn: the id of the call it answers.
    public var toolCallId: String?

    public init(role: String, content: String, toolCalls: [ToolCall] = [], toolCallId: String? = nil) {
        self.role = role
        self.content = content
        self.toolCalls = toolCalls
        self.toolCallId = toolCallId
    }

    public static func system(_ content: String) -> Message { Message(role: "system", content: content) }
    public static func user(_ content: String) -> Message { Message(role: "user", content: content) }
    public static func assistant(_ content: String) -> Message { Message(role: "assistant", content: content) }
    /// An assistant turn that made these calls.
    public static func assistant(toolCalls: [ToolCall]) -> Message { Message(role: "assistant", content: "", toolCalls: toolCalls) }
    /// The result of the call with id `callId`.
    public static func tool(_ content: String, callId: String) -> Message { Message(role: "tool", content: content, toolCallId: callId) }
}

/// A function the model may call (OpenAI's function tool).
public struct Tool: Sendable, Equatable {
    /// 1 to 64 of `[A-Za-z0-9_-]`, unique among the request's tools.
    public var name: String
    public var description: String?
    /// The arguments' JSON schema as JSON text (e.g. `#"{"type": "object", ...}"#`); `nil` is
    /// `{"type": "object"}`.
    public var parameters: String?

    public init(name: String, description: String? = nil, parameters: String? = nil) {
        self.name = name
        self.description = description
        self.parameters = parameters
    }
}

/// Whether and which tool the model must call.
public enum ToolChoice: Sendable, Equatable {
    /// The model chooses (the default).
    case auto
    /// Tools are shown but the output is text.
    case none
    /// A call of one of the tools is forced (grammar-constrained: the arguments validate).
    case required
    /// A call of this function is forced.
    case function(String)
}

/// A streamed piece of a tool call, as OpenAI streams `delta.tool_calls`.
public enum ToolCallDelta: Sendable, Equatable {
    /// Call number `index` (0-based, in the order the model wrote them) begins.
    case start(index: Int, id: String, name: String)
    /// More of call `index`'s arguments JSON text.
    case arguments(index: Int, fragment: String)
}

/// A complete tool call.
public struct ToolCall: Sendable, Equatable {
    /// `call_` + 24 letters or digits.
    public let id: String
    public let name: String
    /// The arguments as JSON text (an object).
    public let arguments: String

    public init(id: String, name: String, arguments: String) {
        self.id = id
        self.name = name
        self.arguments = arguments
    }
}

/// Constrained output: the model can only produce text that matches
/// (docs/constrained-decoding.md).
public enum OutputConstraint: Sendable, Equatable {
    /// Any JSON object (OpenAI's `response_format: {"type": "json_object"}`).
    case jsonObject
    /// A JSON schema, given as JSON text (e.g. `#"{"type": "object", ...}"#`).
    case jsonSchema(String)
    /// A regular expression the whole output must match.
    case regex(String)
    /// A grammar in llguidance's Lark syntax (may embed `%json {schema}`).
    case grammar(String)
    /// Exactly one of these strings.
    case choice([String])
}

/// An image or audio file for a request: its bytes, or a local file path (read by the engine).
public enum MediaInput: Sendable, Equatable {
    case bytes(Data)
    case file(String)
}

/// How a request is sampled and when it stops.
public struct GenerateOptions: Sendable {
    /// Most tokens to generate.
    public var maxTokens: Int
    /// 0 is greedy.
    public var temperature: Double
    /// Nucleus sampling threshold in (0, 1]; 1 disables.
    public var topP: Double
    /// Keep the k most likely tokens; 0 disables.
    public var topK: Int
    /// Drop tokens below `minP × p(top token)`; 0 disables.
    public var minP: Double
    public var repetitionPenalty: Double?
    public var presencePenalty: Double?
    public var frequencyPenalty: Double?
    /// How many recent tokens the penalties look at (default 20).
    public var penaltyContext: Int?
    /// Additive bias per token id (`-Double.infinity` bans a token).
    public var logitBias: [Int: Double]
    /// Makes sampling reproducible.
    public var seed: UInt64?
    /// Generation ends before the first match, which is cut from the text.
    public var stop: [String]
    /// Keep going past the model's end-of-sequence tokens.
    public var ignoreEos: Bool
    /// Report each generated token's log-probability (`Chunk.logprob`, `Completion.logprobs`).
    public var logprobs: Bool
    /// Also report this many most likely alternatives per token (0...20; needs `logprobs`).
    public var topLogprobs: Int?
    /// What the output must match; `nil` is free text.
    public var constraint: OutputConstraint?
    /// Tools the model may call (needs `messages`); calls arrive as `Chunk.toolCalls` pieces
    /// and `Completion.toolCalls` (docs/tools.md).
    public var tools: [Tool]
    public var toolChoice: ToolChoice
    /// `false` ends generation after the first complete call; `nil` = true.
    public var parallelToolCalls: Bool?
    /// Images (PNG / JPEG / WebP) for a model with a vision tower (`ModelInfo.vision`), in
    /// prompt order; the prompt holds the model's begin-of-image marker once per image.
    public var images: [MediaInput]
    /// Audio clips (WAV / MP3 / FLAC / Ogg, at most 30 s) for a model with an audio tower
    /// (`ModelInfo.audio`), in prompt order; the prompt holds its audio token once per clip.
    public var audio: [MediaInput]
    /// Variables for the chat template as a JSON object text (`{"enable_thinking": false}`
    /// turns a reasoning model's thinking off); empty: none.
    public var chatTemplateKwargs: String
    /// Reasoning tokens the model may spend before its reasoning block is closed for it and the
    /// answer begins (`Chunk.reasoning`); nil: unbounded.
    public var reasoningBudget: Int?
    /// Prompt-lookup speculative decoding: draft up to this many tokens per step, 0 to 64 (0:
    /// off); nil: the engine's `numDraftTokens`.
    public var numDraftTokens: Int?

    public init(
        maxTokens: Int = 256,
        temperature: Double = 0,
        topP: Double = 1,
        topK: Int = 0,
        minP: Double = 0,
        repetitionPenalty: Double? = nil,
        presencePenalty: Double? = nil,
        frequencyPenalty: Double? = nil,
        penaltyContext: Int? = nil,
        logitBias: [Int: Double] = [:],
        seed: UInt64? = nil,
        stop: [String] = [],
        ignoreEos: Bool = false,
        logprobs: Bool = false,
        topLogprobs: Int? = nil,
        constraint: OutputConstraint? = nil,
        tools: [Tool] = [],
        toolChoice: ToolChoice = .auto,
        parallelToolCalls: Bool? = nil,
        images: [MediaInput] = [],
        audio: [MediaInput] = [],
        chatTemplateKwargs: String = "",
        reasoningBudget: Int? = nil,
        numDraftTokens: Int? = nil
    ) {
        self.maxTokens = maxTokens
        self.temperature = temperature
        self.topP = topP
        self.topK = topK
        self.minP = minP
        self.repetitionPenalty = repetitionPenalty
        self.presencePenalty = presencePenalty
        self.frequencyPenalty = frequencyPenalty
        self.penaltyContext = penaltyContext
        self.logitBias = logitBias
        self.seed = seed
        self.stop = stop
        self.ignoreEos = ignoreEos
        self.logprobs = logprobs
        self.topLogprobs = topLogprobs
        self.constraint = constraint
        self.tools = tools
        self.toolChoice = toolChoice
        self.parallelToolCalls = parallelToolCalls
        self.images = images
        self.audio = audio
        self.chatTemplateKwargs = chatTemplateKwargs
        self.reasoningBudget = reasoningBudget
        self.numDraftTokens = numDraftTokens
    }
}

/// One streamed piece of output.
public struct Chunk: Sendable, Equatable {
    /// Text this token completes (may be empty while a multi-byte character or a possible stop
    /// string is held back).
    public let text: String
    /// The generated token; nil on a last chunk that only carries text held back when the
    /// request ended.
    public let tokenId: Int?
    /// With `logprobs`: the token's natural-log probability (after logit bias and penalties,
    /// before temperature); nil otherwise and on a held-back-text chunk.
    public let logprob: Double?
    /// With `logprobs`: the `topLogprobs` most likely tokens at this step, best first (empty
    /// when `topLogprobs` is nil or 0).
    public let topLogprobs: [TokenLogprob]?
    /// With `tools`: the pieces of tool calls this chunk adds, in order (a call's text is never
    /// in `text`); empty otherwise. Assembled, they are `Completion.toolCalls`.
    public let toolCalls: [ToolCallDelta]
    /// The reasoning ("thinking") text this chunk adds, for a model whose chat template marks
    /// reasoning: kept apart from `text`, markers removed; empty otherwise.
    public var reasoning: String = ""
}

/// One of the most likely tokens at a step.
public struct TokenLogprob: Sendable, Equatable {
    public let tokenId: Int
    /// Natural-log probability.
    public let logprob: Double
}

/// A generated token's log-probability and the most likely alternatives at its step.
public struct TokenLogprobs: Sendable, Equatable {
    public let tokenId: Int
    public let logprob: Double
    /// Best first.
    public let topLogprobs: [TokenLogprob]
}

public enum FinishReason: String, Sendable, Equatable {
    /// An end-of-sequence token, a stop string or a complete constraint.
    case stop
    /// `maxTokens` or the model's context length.
    case length
    /// The consuming task was cancelled, the loop was left early, `cancel()` or `close()`.
    case cancelled
    /// A request with `tools` stopped after making calls (`Completion.toolCalls`).
    case toolCalls = "tool_calls"
}

public struct Usage: Sendable, Equatable {
    public let promptTokens: Int
    public let completionTokens: Int
    /// Prompt tokens whose KV came from the prompt cache.
    public let cachedTokens: Int
    /// Completion tokens spent reasoning (the reasoning block and its markers).
    public var reasoningTokens: Int = 0
}

/// A finished request.
public struct Completion: Sendable, Equatable {
    public let text: String
    /// Generated token ids (an end-of-sequence token that stopped generation is not included).
    public let tokenIds: [Int]
    public let finishReason: FinishReason
    public let usage: Usage
    /// With `logprobs`: one entry per generated token, in the order of `tokenIds`.
    public let logprobs: [TokenLogprobs]?
    /// Every tool call the output made, complete (a call the output did not finish is not
    /// delivered); empty without `tools`.
    public let toolCalls: [ToolCall]
    /// The model's reasoning, apart from `text` (empty for a model without reasoning).
    public var reasoning: String = ""
}

/// What was loaded.
public struct ModelInfo: Sendable, Equatable {
    /// The resolved model path.
    public let path: String
    /// `config.json`'s `model_type` (`llama`, `qwen3`...).
    public let modelType: String
    public let vocabSize: Int
    public let numLayers: Int
    /// Longest context the model was trained for, when its config says.
    public let contextLength: Int?
    /// Whether the model has a tokenizer (else only `promptIds` work).
    public let hasTokenizer: Bool
    /// The model takes images (`GenerateOptions.images`): it has a vision tower Weft runs.
    public let vision: Bool
    /// The model takes audio (`GenerateOptions.audio`): it has an audio tower Weft runs.
    public let audio: Bool
}

/// A snapshot of the engine's scheduler and counters (published after each engine step).
public struct EngineStats: Sendable, Equatable {
    public let activeRows: Int
    public let queuedRows: Int
    public let prefillingRows: Int
    /// Rows paused because their consumer lags (back-pressure); they resume when it catches up.
    public let pausedRows: Int
    public let kvBytesInUse: UInt64
    /// `nil` when there is no KV budget.
    public let kvBudgetBytes: UInt64?
    public let promptCacheBytes: UInt64
    public let promptCacheEntries: Int
    public let promptCacheHits: UInt64
    /// Prompt tokens served from the prompt cache (summed over its hits).
    public let promptCacheCachedTokens: UInt64
    /// The most the prompt cache holds (0: off).
    public let promptCacheCapacityBytes: UInt64
    /// Entries dropped to stay under the capacity or to make room for running requests.
    public let promptCacheEvictions: UInt64
    /// How many files of the prompt-cache directory were refused at load.
    public let promptCacheFilesRefused: Int
    public let tokensGenerated: UInt64
    public let decodeSteps: UInt64
    public let requestsFinished: UInt64
    /// Speculative decoding: verification steps run, draft tokens proposed and accepted.
    public let speculativeSteps: UInt64
    public let draftTokens: UInt64
    public let draftTokensAccepted: UInt64
}

/// A prompt-cache entry written by `Engine.savePromptCache` or read by `Engine.loadPromptCache`.
public struct PromptCacheEntry: Sendable, Equatable {
    /// The tokens the entry holds.
    public let tokens: Int
    /// The file's size.
    public let bytes: UInt64
}
