import Foundation
import WeftBridge

/// A loaded model served by a continuous-batching engine. Share one engine across tasks:
/// concurrent `generate` / `complete` calls decode together in one batch.
///
/// ```swift
/// let engine = try Engine(options: .init(maxBatch: 8))
/// for try await chunk in engine.generate(messages: [.user("Hi")], options: .init(maxTokens: 64)) {
///     print(chunk.text, terminator: "")
/// }
/// ```
public final class Engine: Sendable {
    public struct Options: Sendable {
        /// An mlx-lm model directory or a `.gguf` file, or a Hugging Face repo id
        /// (`org/repo[@revision][:file]`, fetched into the Hugging Face cache; `Engine.load`
        /// reports the download);
        /// `nil` is the default model (SmolLM2-135M-Instruct), downloaded and verified on first use.
        public var model: String?
        /// CPU kernels: `"fast"` (Weft's, the default) or `"exact"` (MLX's own, bit for bit
        /// mlx-lm); `nil` = `WEFT_CPU_KERNELS` if set, else fast. This engine's alone: another
        /// engine in the process may use the other mode.
        public var cpuKernels: String?
        /// What fast mode's quantized matmul multiplies the weights with below 16 rows (decode):
        /// `"int8"` (llama.cpp-style activations, as close to exact mode as llama.cpp) or
        /// `"float"` (slower, closer); `nil` = `WEFT_CPU_ACTIVATIONS` if set, else int8.
        public var cpuActivations: String?
        /// GGUF block types MLX's reader lacks: `"native"` (kept quantized, the default) or
        /// `"dequantize"` (all float32); `nil` = `WEFT_GGUF_WEIGHTS` if set, else native.
        public var ggufWeights: String?
        /// Rows decoding together.
        public var maxBatch: Int
        /// Requests admitted to prefill at once.
        public var promptConcurrency: Int
        /// Prompt tokens per prefill chunk; decode steps interleave between chunks.
        public var prefillStepSize: Int
        /// Projected KV-cache bytes allowed across admitted rows; `nil` = no limit.
        public var kvBudgetBytes: UInt64?
        /// Bytes of KV kept for prompt-prefix reuse (finished rows and their chat-boundary
        /// checkpoints); 0 = off; `nil` (the default) = sized from the memory left after loading.
        public var promptCacheBytes: UInt64?
        /// Store keys and values affine-quantized to this many bits (2, 3, 4, 5, 6 or 8); `nil`
        /// = full precision, the mode that matches mlx-lm token for token.
        public var kvBits: Int?
        /// Elements per KV quantization group: 32, 64 or 128, dividing the model's head size.
        public var kvGroupSize: Int
        /// Positions a row keeps in full precision before its KV is quantized.
        public var quantizedKvStart: Int
        /// Largest buffer cache (freed buffers kept for reuse) MLX keeps; `nil` = MLX's default.
        public var cacheLimitBytes: UInt64?
        /// Return MLX's buffer cache every this many decode steps (0 = only when idle); `nil` =
        /// the engine's default (256).
        public var clearCacheEverySteps: Int?
        /// MLX's memory limit (>= 1); `nil` = MLX's default.
        public var memoryLimitBytes: UInt64?
        /// Memory MLX may keep wired on Apple GPUs; `nil` = MLX's default.
        public var wiredLimitBytes: UInt64?
        /// Prompt-lookup speculative decoding for requests that name no `numDraftTokens`: draft
        /// up to this many tokens per step, 0 to 64 (0 = off).
        public var numDraftTokens: Int
        /// A draft model (a local model directory or file sharing the tokenizer) drafts the
        /// `numDraftTokens` (default 3 when 0) instead of prompt lookup; `nil` = prompt lookup.
        public var draftModel: String?

        public init(
            model: String? = nil,
            cpuKernels: String? = nil,
            cpuActivations: String? = nil,
            ggufWeights: String? = nil,
            maxBatch: Int = 8,
            promptConcurrency: Int = 8,
            prefillStepSize: Int = 2048,
            kvBudgetBytes: UInt64? = nil,
            promptCacheBytes: UInt64? = nil,
            kvBits: Int? = nil,
            kvGroupSize: Int = 64,
            quantizedKvStart: Int = 0,
            cacheLimitBytes: UInt64? = nil,
            clearCacheEverySteps: Int? = nil,
            memoryLimitBytes: UInt64? = nil,
            wiredLimitBytes: UInt64? = nil,
            numDraftTokens: Int = 0,
            draftModel: String? = nil
        ) {
            self.model = model
            self.cpuKernels = cpuKernels
            self.cpuActivations = cpuActivations
            self.ggufWeights = ggufWeights
            self.maxBatch = maxBatch
            self.promptConcurrency = promptConcurrency
            self.prefillStepSize = prefillStepSize
            self.kvBudgetBytes = kvBudgetBytes
            self.promptCacheBytes = promptCacheBytes
            self.kvBits = kvBits
            self.kvGroupSize = kvGroupSize
            self.quantizedKvStart = quantizedKvStart
            self.cacheLimitBytes = cacheLimitBytes
            self.clearCacheEverySteps = clearCacheEverySteps
            self.memoryLimitBytes = memoryLimitBytes
            self.wiredLimitBytes = wiredLimitBytes
            self.numDraftTokens = numDraftTokens
            self.draftModel = draftModel
        }

        /// The options as the request contract's camelCase fields (checked on the Rust side).
        var contractFields: [String: Any] {
            var o: [String: Any] = [
                "maxBatch": maxBatch,
                "promptConcurrency": promptConcurrency,
                "prefillStepSize": prefillStepSize,
                "kvGroupSize": kvGroupSize,
                "quantizedKvStart": quantizedKvStart,
                "numDraftTokens": numDraftTokens,
            ]
            o["model"] = model
            o["draftModel"] = draftModel
            // With a draft model, 0 leaves the engine's default (3 tokens a step).
            if draftModel != nil && numDraftTokens == 0 { o["numDraftTokens"] = nil }
            o["cpuKernels"] = cpuKernels
            o["cpuActivations"] = cpuActivations
            o["ggufWeights"] = ggufWeights
            o["kvBudgetBytes"] = kvBudgetBytes
            o["promptCacheBytes"] = promptCacheBytes
            o["kvBits"] = kvBits
            o["cacheLimitBytes"] = cacheLimitBytes
            o["clearCacheEverySteps"] = clearCacheEverySteps
            o["memoryLimitBytes"] = memoryLimitBytes
            o["wiredLimitBytes"] = wiredLimitBytes
            return o
        }
    }

    private let rust: RustEngine
    public let modelInfo: ModelInfo

    /// Loads the model and starts the engine thread. Blocks while loading; call it off the main
    /// actor in apps. Throws `WeftError` (`.invalidArgument`, `.modelLoad`, `.unsupported`,
    /// `.capacity`...).
    public convenience init(options: Options = Options()) throws {
        do {
            self.init(rust: try load_engine(ContractJSON.text(options.contractFields)))
        } catch let e as RustError {
            throw WeftError(e)
        }
    }

    /// Loads the model like `init(options:)`, handing each report of its download (a Hugging
    /// Face repo id not yet in the cache) to `onProgress` on the loading thread, at most every
    /// ~100 ms per phase plus when a phase starts and ends. `onProgress` returning `false`
    /// cancels the download: the init throws `.cancelled`, the bytes received stay in the cache's
    /// `.incomplete` file (never under a name that loads) and the next load resumes them.
    public convenience init(options: Options = Options(), onProgress: @escaping (DownloadProgress) -> Bool) throws {
        // The bridge's sink answers "cancel?"; the handler answers "go on?".
        let sink = ProgressSink { phase, downloaded, total in
            !onProgress(DownloadProgress(phase: .init(code: phase), downloaded: downloaded, total: total == 0 ? nil : total))
        }
        do {
            self.init(rust: try load_engine_reporting(ContractJSON.text(options.contractFields), sink))
        } catch let e as RustError {
            throw WeftError(e)
        }
    }

    /// What `Engine.load` streams: download reports, then the engine.
    public enum LoadEvent: Sendable {
        case progress(DownloadProgress)
        case loaded(Engine)
    }

    /// Loads the model on a thread of its own, streaming its download's progress and then the
    /// engine:
    ///
    /// ```swift
    /// for try await event in Engine.load(options: .init(model: "mlx-community/Qwen3-0.6B-4bit")) {
    ///     switch event {
    ///     case .progress(let p): bar.show(p.phase, p.downloaded, p.total)
    ///     case .loaded(let engine): self.engine = engine
    ///     }
    /// }
    /// ```
    ///
    /// Leaving the loop early or cancelling the consuming task cancels the download (a load
    /// already past it still finishes, and its engine is closed when released).
    public static func load(options: Options = Options()) -> AsyncThrowingStream<LoadEvent, Error> {
        AsyncThrowingStream { continuation in
            let stopped = StopFlag()
            continuation.onTermination = { _ in stopped.set() }
            Thread.detachNewThread {
                do {
                    let engine = try Engine(options: options) { progress in
                        continuation.yield(.progress(progress))
                        return !stopped.isSet
                    }
                    continuation.yield(.loaded(engine))
                    continuation.finish()
                } catch {
                    continuation.finish(throwing: error)
                }
            }
        }
    }

    private init(rust: RustEngine) {
        self.rust = rust
        let context = rust.context_length()
        modelInfo = ModelInfo(
            path: rust.model_path().toString(),
            modelType: rust.model_type().toString(),
            vocabSize: Int(rust.vocab_size()),
            numLayers: Int(rust.num_layers()),
            contextLength: context == 0 ? nil : Int(clamping: context),
            hasTokenizer: rust.has_tokenizer(),
            vision: rust.has_vision(),
            audio: rust.has_audio()
        )
    }

    /// Streams the reply to a conversation rendered with the model's chat template.
    /// Leaving the loop early or cancelling the consuming task cancels the request in the
    /// engine. An invalid request throws its `WeftError` from the first iteration.
    public func generate(messages: [Message], options: GenerateOptions = GenerateOptions()) -> Generation {
        start(options, input: ["messages": messages.map(\.contractFields)])
    }

    /// Streams the continuation of raw text (tokenized as is).
    public func generate(prompt: String, options: GenerateOptions = GenerateOptions()) -> Generation {
        start(options, input: ["prompt": prompt])
    }

    /// Streams the continuation of token ids (works with models that have no tokenizer).
    public func generate(promptIds: [Int], options: GenerateOptions = GenerateOptions()) -> Generation {
        start(options, input: ["promptIds": promptIds])
    }

    /// Runs a conversation to the end: text, token ids, finish reason and usage. Cancelling the
    /// calling task cancels the request (the result then has `finishReason == .cancelled`).
    public func complete(messages: [Message], options: GenerateOptions = GenerateOptions()) async throws -> Completion {
        try await generate(messages: messages, options: options).completion()
    }

    /// Runs raw text to the end.
    public func complete(prompt: String, options: GenerateOptions = GenerateOptions()) async throws -> Completion {
        try await generate(prompt: prompt, options: options).completion()
    }

    /// Runs token ids to the end.
    public func complete(promptIds: [Int], options: GenerateOptions = GenerateOptions()) async throws -> Completion {
        try await generate(promptIds: promptIds, options: options).completion()
    }

    /// Scheduler state and counters. After `close()`, all zero.
    public func stats() -> EngineStats {
        func stat(_ name: String) -> UInt64 { rust.stat(name) }
        let budget = stat("kvBudgetBytes")
        return EngineStats(
            activeRows: Int(clamping: stat("activeRows")),
            queuedRows: Int(clamping: stat("queuedRows")),
            prefillingRows: Int(clamping: stat("prefillingRows")),
            pausedRows: Int(clamping: stat("pausedRows")),
            kvBytesInUse: stat("kvBytesInUse"),
            kvBudgetBytes: budget == 0 ? nil : budget,
            promptCacheBytes: stat("promptCacheBytes"),
            promptCacheEntries: Int(clamping: stat("promptCacheEntries")),
            promptCacheHits: stat("promptCacheHits"),
            promptCacheCachedTokens: stat("promptCacheCachedTokens"),
            promptCacheCapacityBytes: stat("promptCacheCapacityBytes"),
            promptCacheEvictions: stat("promptCacheEvictions"),
            promptCacheFilesRefused: Int(clamping: stat("promptCacheFilesRefused")),
            tokensGenerated: stat("tokensGenerated"),
            decodeSteps: stat("decodeSteps"),
            requestsFinished: stat("requestsFinished"),
            speculativeSteps: stat("speculativeSteps"),
            draftTokens: stat("draftTokens"),
            draftTokensAccepted: stat("draftTokensAccepted")
        )
    }

    /// Saves one prompt-cache entry to the file at `path`, so a fixed preamble is prefilled once,
    /// ever (load it into a later engine with `loadPromptCache(from:)`): the most recently used
    /// entry (after a request, its prompt and answer). Blocks while the engine writes it between
    /// two steps. Throws `.notFound` when nothing is cached, `.unsupported` when the prompt
    /// cache is off.
    @discardableResult
    public func savePromptCache(to path: String) throws -> PromptCacheEntry {
        try saveEntry(path, request: "")
    }

    /// Saves the cached prefix a request with these messages would reuse (rendered with the
    /// options' tools and template variables as a request's are).
    @discardableResult
    public func savePromptCache(to path: String, messages: [Message], options: GenerateOptions = GenerateOptions()) throws -> PromptCacheEntry {
        try saveEntry(path, request: ContractJSON.text(options.contractFields.merging(["messages": messages.map(\.contractFields)]) { _, given in given }))
    }

    /// Saves the cached prefix a request with this raw text would reuse.
    @discardableResult
    public func savePromptCache(to path: String, prompt: String) throws -> PromptCacheEntry {
        try saveEntry(path, request: ContractJSON.text(GenerateOptions().contractFields.merging(["prompt": prompt]) { _, given in given }))
    }

    /// Saves the cached prefix a request with these token ids would reuse.
    @discardableResult
    public func savePromptCache(to path: String, promptIds: [Int]) throws -> PromptCacheEntry {
        try saveEntry(path, request: ContractJSON.text(GenerateOptions().contractFields.merging(["promptIds": promptIds]) { _, given in given }))
    }

    /// Loads an entry `savePromptCache` wrote into this engine's prompt cache: later requests
    /// whose prompts start with its tokens reuse it, with outputs equal to a cold run's. A file
    /// saved for another model, tokenizer or kernel mode, or truncated or corrupt, throws
    /// `.invalidArgument` saying why; a missing file `.notFound`.
    @discardableResult
    public func loadPromptCache(from path: String) throws -> PromptCacheEntry {
        do {
            let e = try rust.load_prompt_cache(path)
            return PromptCacheEntry(tokens: Int(clamping: e.tokens()), bytes: e.bytes())
        } catch let e as RustError {
            throw WeftError(e)
        }
    }

    private func saveEntry(_ path: String, request: String) throws -> PromptCacheEntry {
        do {
            let e = try rust.save_prompt_cache(path, request)
            return PromptCacheEntry(tokens: Int(clamping: e.tokens()), bytes: e.bytes())
        } catch let e as RustError {
            throw WeftError(e)
        }
    }

    /// Whether `close()` was called.
    public var isClosed: Bool { rust.is_closed() }

    /// Cancels every outstanding request (their streams end with `.cancelled`), stops the engine
    /// thread and frees the model; blocks until that is done. Later requests fail with
    /// `.engineClosed`. Closing twice is harmless. Without it, the engine stops when the `Engine`
    /// and every unfinished `Generation` are released.
    public func close() {
        rust.close()
    }

    /// `input`: the request's prompt, messages or promptIds field.
    private func start(_ options: GenerateOptions, input: [String: Any]) -> Generation {
        let state = RowState(logprobs: options.logprobs)
        do {
            let request = options.contractFields.merging(input) { _, given in given }
            let sink = EventSink(
                onTopLogprob: { [state] id, logprob in state.topLogprob(Int(id), logprob) },
                onToken: { [state] id, text, logprob in state.token(Int(id), text, logprob) },
                onToolStart: { [state] index, id, name in state.toolDelta(.start(index: Int(index), id: id, name: name)) },
                onToolArguments: { [state] index, fragment in state.toolDelta(.arguments(index: Int(index), fragment: fragment)) },
                onToolCall: { [state] id, name, arguments in state.toolCall(ToolCall(id: id, name: name, arguments: arguments)) },
                onReasoning: { [state] text in state.reasoning(text) },
                onDone: { [state] reason, prompt, completion, cached, reasoning in
                    state.done(reason: reason, prompt: prompt, completion: completion, cached: cached, reasoning: reasoning)
                },
                onError: { [state] code, message in state.fail(WeftError(code: .init(rawValue: code), message: message)) }
            )
            let row: RustRow
            do {
                row = try rust.submit(ContractJSON.text(request), sink)
            } catch let e as RustError {
                throw WeftError(e)
            }
            state.attach(row)
        } catch let e as WeftError {
            state.fail(e)
        } catch {
            state.fail(WeftError(code: .generationFailed, message: "\(error)"))
        }
        return Generation(state: state)
    }
}

/// One report of a model download.
public struct DownloadProgress: Sendable, Equatable {
    public enum Phase: Sendable, Equatable {
        /// Another process is downloading the same file; waiting for it.
        case waiting
        /// Receiving bytes (a repo's small files, then its weights: each batch counts from 0).
        case downloading
        /// Hashing a local file.
        case verifying
        /// Unpacking the default model.
        case extracting
        /// The model is in place; once, at the end.
        case done

        init(code: UInt8) {
            switch code {
            case 0: self = .waiting
            case 1: self = .downloading
            case 2: self = .verifying
            case 3: self = .extracting
            default: self = .done
            }
        }
    }

    public let phase: Phase
    /// Bytes done in this phase.
    public let downloaded: UInt64
    /// Bytes the phase will reach, when known.
    public let total: UInt64?
}

/// Set once from any thread (a stream's termination), read by the loading thread.
final class StopFlag: @unchecked Sendable {
    private let lock = NSLock()
    private var stopped = false

    func set() {
        lock.lock()
        stopped = true
        lock.unlock()
    }

    var isSet: Bool {
        lock.lock()
        defer { lock.unlock() }
        return stopped
    }
}

extension WeftError {
    init(_ e: RustError) {
        self.init(code: Code(rawValue: e.code().toString()), message: e.message().toString())
    }
}

extension GenerateOptions {
    /// The options as the request contract's camelCase fields (checked on the Rust side).
    var contractFields: [String: Any] {
        var o: [String: Any] = [
            "maxTokens": maxTokens,
            "temperature": ContractJSON.number(temperature),
            "topP": ContractJSON.number(topP),
            "topK": topK,
            "minP": ContractJSON.number(minP),
            "ignoreEos": ignoreEos,
            "logprobs": logprobs,
        ]
        o["repetitionPenalty"] = repetitionPenalty.map(ContractJSON.number)
        o["presencePenalty"] = presencePenalty.map(ContractJSON.number)
        o["frequencyPenalty"] = frequencyPenalty.map(ContractJSON.number)
        o["penaltyContext"] = penaltyContext
        o["seed"] = seed
        o["topLogprobs"] = topLogprobs
        if !logitBias.isEmpty {
            o["logitBias"] = Dictionary(uniqueKeysWithValues: logitBias.map { (String($0.key), ContractJSON.number($0.value)) })
        }
        if !stop.isEmpty { o["stop"] = stop }
        switch constraint {
        case nil: break
        case .jsonObject?: o["responseFormat"] = ["type": "json_object"]
        case .jsonSchema(let text)?: o["jsonSchema"] = ContractJSON.parsed(text)
        case .regex(let rx)?: o["regex"] = rx
        case .grammar(let lark)?: o["grammar"] = lark
        case .choice(let items)?: o["choice"] = items
        }
        if !tools.isEmpty {
            o["tools"] = tools.map { tool -> [String: Any] in
                var function: [String: Any] = ["name": tool.name]
                function["description"] = tool.description
                function["parameters"] = tool.parameters.map(ContractJSON.parsed)
                return ["type": "function", "function": function]
            }
        }
        switch toolChoice {
        case .auto: break
        case .none: o["toolChoice"] = "none"
        case .required: o["toolChoice"] = "required"
        case .function(let name): o["toolChoice"] = ["type": "function", "function": ["name": name]]
        }
        o["parallelToolCalls"] = parallelToolCalls
        if !chatTemplateKwargs.isEmpty {
            o["chatTemplateKwargs"] = ContractJSON.parsed(chatTemplateKwargs)
        }
        o["reasoningBudget"] = reasoningBudget
        o["numDraftTokens"] = numDraftTokens
        if !images.isEmpty { o["images"] = images.map(\.contractValue) }
        if !audio.isEmpty { o["audio"] = audio.map(\.contractValue) }
        return o
    }
}

extension MediaInput {
    /// The request contract's form: `{"base64": ...}` for bytes, the path as a string.
    var contractValue: Any {
        switch self {
        case .bytes(let data): return ["base64": data.base64EncodedString()]
        case .file(let path): return path
        }
    }
}

extension Message {
    /// The turn as the request contract's camelCase fields.
    var contractFields: [String: Any] {
        var m: [String: Any] = ["role": role, "content": content]
        if !toolCalls.isEmpty {
            m["toolCalls"] = toolCalls.map {
                ["id": $0.id, "type": "function", "function": ["name": $0.name, "arguments": $0.arguments]] as [String: Any]
            }
        }
        m["toolCallId"] = toolCallId
        return m
    }
}

/// The JSON text the Rust half parses with the core's request contract (`weft::contract`).
enum ContractJSON {
    /// A number JSON can hold; the non-finite ones as the words the contract names in its
    /// messages (`"-Infinity"` is also how a logit bias bans a token).
    static func number(_ x: Double) -> Any {
        if x.isNaN { return "NaN" }
        if x.isInfinite { return x > 0 ? "Infinity" : "-Infinity" }
        return x
    }

    /// JSON text given by the caller (a schema) as a value; text that is not JSON goes as a
    /// string, which the contract reports as not a schema.
    static func parsed(_ text: String) -> Any {
        (try? JSONSerialization.jsonObject(with: Data(text.utf8), options: [.fragmentsAllowed])) ?? text
    }

    /// Only strings, numbers, booleans, arrays and dictionaries go in; should serialization still
    /// fail, `null` makes the contract report it as an invalid argument.
    static func text(_ object: [String: Any]) -> String {
        guard let data = try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]) else { return "null" }
        return String(decoding: data, as: UTF8.self)
    }
}
