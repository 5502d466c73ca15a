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
        /// An mlx-lm model directory or a `.gguf` file; `nil` is the default model
        /// (SmolLM2-135M-Instruct), downloaded and verified on first use.
        public var model: String?
        /// Rows decoding together.
        public var maxBatch: Int
        /// Requests admitted to prefill at once.
        public var promptConcurrency: Int
        /// Prompt tokens per prefill chunk; decode steps interleave between chunks.
        public var prefillStepSize: Int
        /// Projected KV-cache bytes allowed across admitted rows; `nil` = no limit.
        public var kvBudgetBytes: UInt64?
        /// Bytes of finished rows' KV kept for prompt-prefix reuse; 0 = off.
        public var promptCacheBytes: UInt64
        /// Store keys and values affine-quantized to this many bits (2, 3, 4, 5, 6 or 8); `nil`
        /// = full precision, the mode that matches mlx-lm token for token.
        public var kvBits: Int?
        /// Elements per KV quantization group: 32, 64 or 128, dividing the model's head size.
        public var kvGroupSize: Int
        /// Positions a row keeps in full precision before its KV is quantized.
        public var quantizedKvStart: Int

        public init(
            model: String? = nil,
            maxBatch: Int = 8,
            promptConcurrency: Int = 8,
            prefillStepSize: Int = 2048,
            kvBudgetBytes: UInt64? = nil,
            promptCacheBytes: UInt64 = 0,
            kvBits: Int? = nil,
            kvGroupSize: Int = 64,
            quantizedKvStart: Int = 0
        ) {
            self.model = model
            self.maxBatch = maxBatch
            self.promptConcurrency = promptConcurrency
            self.prefillStepSize = prefillStepSize
            self.kvBudgetBytes = kvBudgetBytes
            self.promptCacheBytes = promptCacheBytes
            self.kvBits = kvBits
            self.kvGroupSize = kvGroupSize
            self.quantizedKvStart = quantizedKvStart
        }
    }

    private let rust: RustEngine
    public let modelInfo: ModelInfo

    /// Loads the model and starts the engine thread. Blocks while loading; call it off the main
    /// actor in apps. Throws `WeftError` (`.invalidArgument`, `.modelLoad`, `.unsupported`,
    /// `.capacity`...).
    public init(options: Options = Options()) throws {
        func count(_ name: String, _ value: Int) throws -> UInt32 {
            guard value >= 1, value <= Int(UInt32.max) else {
                throw WeftError.invalid("\(name) must be an integer >= 1, got \(value)")
            }
            return UInt32(value)
        }
        if options.model == "" {
            throw WeftError.invalid("model must be a non-empty path (nil for the default model)")
        }
        if options.kvBudgetBytes == 0 {
            throw WeftError.invalid("kvBudgetBytes must be positive when set")
        }
        if let bits = options.kvBits, bits < 1 || bits > 16 {
            throw WeftError.invalid("kvBits must be 2, 3, 4, 5, 6 or 8, got \(bits)")
        }
        if options.quantizedKvStart < 0 {
            throw WeftError.invalid("quantizedKvStart must be >= 0, got \(options.quantizedKvStart)")
        }
        do {
            rust = try load_engine(
                options.model ?? "",
                try count("maxBatch", options.maxBatch),
                try count("promptConcurrency", options.promptConcurrency),
                try count("prefillStepSize", options.prefillStepSize),
                options.kvBudgetBytes ?? 0,
                options.promptCacheBytes,
                UInt32(options.kvBits ?? 0),
                try count("kvGroupSize", options.kvGroupSize),
                UInt64(options.quantizedKvStart)
            )
        } catch let e as RustError {
            throw WeftError(e)
        }
        let context = rust.context_length()
        modelInfo = ModelInfo(
            path: rust.model_path().toString(),
            modelType: rust.model_type().toString(),
            vocabSize: Int(rust.vocab_size()),
            numLayers: Int(rust.num_layers()),
            contextLength: context == 0 ? nil : Int(clamping: context),
            hasTokenizer: rust.has_tokenizer()
        )
    }

    /// Streams the reply to a conversation rendered with the model's chat template.
    /// Leaving the loop early or cancelling the consuming task cancels the request in the
    /// engine. An invalid request throws its `WeftError` from the first iteration.
    public func generate(messages: [Message], options: GenerateOptions = GenerateOptions()) -> Generation {
        start(options) { r in
            guard !messages.isEmpty else { throw WeftError.invalid("messages must not be empty") }
            for m in messages { r.add_message(m.role, m.content) }
        }
    }

    /// Streams the continuation of raw text (tokenized as is).
    public func generate(prompt: String, options: GenerateOptions = GenerateOptions()) -> Generation {
        start(options) { r in
            guard !prompt.isEmpty else { throw WeftError.invalid("prompt must not be empty") }
            r.set_prompt(prompt)
        }
    }

    /// Streams the continuation of token ids (works with models that have no tokenizer).
    public func generate(promptIds: [Int], options: GenerateOptions = GenerateOptions()) -> Generation {
        start(options) { r in
            guard !promptIds.isEmpty else { throw WeftError.invalid("promptIds must not be empty") }
            for (i, id) in promptIds.enumerated() {
                guard let id32 = UInt32(exactly: id) else {
                    throw WeftError.invalid("promptIds[\(i)] must be a token id (an integer >= 0), got \(id)")
                }
                r.add_prompt_id(id32)
            }
        }
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
            kvBytesInUse: stat("kvBytesInUse"),
            kvBudgetBytes: budget == 0 ? nil : budget,
            promptCacheBytes: stat("promptCacheBytes"),
            promptCacheEntries: Int(clamping: stat("promptCacheEntries")),
            promptCacheHits: stat("promptCacheHits"),
            tokensGenerated: stat("tokensGenerated"),
            decodeSteps: stat("decodeSteps"),
            requestsFinished: stat("requestsFinished")
        )
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

    private func start(_ options: GenerateOptions, input: (RustRequest) throws -> Void) -> Generation {
        let state = RowState()
        do {
            let request = new_request()
            try input(request)
            try options.apply(to: request)
            let sink = EventSink(
                onToken: { [state] id, text in state.token(Int(id), text) },
                onDone: { [state] reason, prompt, completion, cached in
                    state.done(reason: reason, prompt: prompt, completion: completion, cached: cached)
                },
                onError: { [state] code, message in state.fail(WeftError(code: .init(rawValue: code), message: message)) }
            )
            let row: RustRow
            do {
                row = try rust.submit(request, sink)
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

extension WeftError {
    init(_ e: RustError) {
        self.init(code: Code(rawValue: e.code().toString()), message: e.message().toString())
    }
}

extension GenerateOptions {
    func apply(to r: RustRequest) throws {
        guard maxTokens >= 1 else { throw WeftError.invalid("maxTokens must be at least 1, got \(maxTokens)") }
        r.set_max_tokens(UInt64(maxTokens))
        r.set_temperature(temperature)
        r.set_top_p(topP)
        guard let k = UInt32(exactly: topK) else { throw WeftError.invalid("topK must be an integer >= 0, got \(topK)") }
        r.set_top_k(k)
        r.set_min_p(minP)
        if let p = repetitionPenalty { r.set_repetition_penalty(p) }
        if let p = presencePenalty { r.set_presence_penalty(p) }
        if let p = frequencyPenalty { r.set_frequency_penalty(p) }
        if let n = penaltyContext {
            guard n >= 1 else { throw WeftError.invalid("penaltyContext must be at least 1, got \(n)") }
            r.set_penalty_context(UInt64(n))
        }
        for (id, bias) in logitBias.sorted(by: { $0.key < $1.key }) {
            guard let id32 = UInt32(exactly: id) else { throw WeftError.invalid("logitBias key \(id) is not a token id") }
            r.add_logit_bias(id32, bias)
        }
        if let s = seed { r.set_seed(s) }
        for s in stop { r.add_stop(s) }
        r.set_ignore_eos(ignoreEos)
    }
}
