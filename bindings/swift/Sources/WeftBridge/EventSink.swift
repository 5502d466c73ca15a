// Hand-written companions of the generated glue in Generated/ (which rust/build.rs rewrites).

/// Receives one request's events. The Rust side calls these methods on the engine's thread, so
/// the closures must not block (Weft's closures append to the request's own stream buffer).
public final class EventSink {
    let top: (UInt32, Double) -> Void
    let token: (UInt32, String, Double) -> Void
    let toolStart: (UInt32, String, String) -> Void
    let toolArguments: (UInt32, String) -> Void
    let toolCall: (String, String, String) -> Void
    let reasoning: (String) -> Void
    let done: (UInt8, UInt64, UInt64, UInt64, UInt64) -> Void
    let error: (String, String) -> Void

    /// - Parameters:
    ///   - onTopLogprob: one of the next token's most likely alternatives (id, log-probability),
    ///     best first, when the request asked for them.
    ///   - onToken: a token id, the text it completes (possibly empty) and its log-probability
    ///     (NaN unless the request asked for log-probabilities).
    ///   - onToolStart: a tool call begins (index, id, name); pieces of calls come before the
    ///     `onToken` they belong to.
    ///   - onToolArguments: more of call `index`'s arguments JSON text.
    ///   - onToolCall: a complete call (id, name, arguments), each right before `onDone`.
    ///   - onReasoning: reasoning text of a model that thinks first, before the `onToken` it
    ///     belongs to.
    ///   - onDone: finish reason (0 stop, 1 length, 2 cancelled, 3 tool calls), prompt,
    ///     completion, cached and reasoning token counts. Final.
    ///   - onError: an error code and message. Final.
    public init(
        onTopLogprob: @escaping (UInt32, Double) -> Void = { _, _ in },
        onToken: @escaping (UInt32, String, Double) -> Void,
        onToolStart: @escaping (UInt32, String, String) -> Void = { _, _, _ in },
        onToolArguments: @escaping (UInt32, String) -> Void = { _, _ in },
        onToolCall: @escaping (String, String, String) -> Void = { _, _, _ in },
        onReasoning: @escaping (String) -> Void = { _ in },
        onDone: @escaping (UInt8, UInt64, UInt64, UInt64, UInt64) -> Void,
        onError: @escaping (String, String) -> Void
    ) {
        top = onTopLogprob
        token = onToken
        toolStart = onToolStart
        toolArguments = onToolArguments
        toolCall = onToolCall
        reasoning = onReasoning
        done = onDone
        error = onError
    }

    func on_top_logprob(token_id: UInt32, logprob: Double) {
        top(token_id, logprob)
    }

    func on_token(token_id: UInt32, text: RustString, logprob: Double) {
        token(token_id, text.toString(), logprob)
    }

    func on_tool_start(index: UInt32, id: RustString, name: RustString) {
        toolStart(index, id.toString(), name.toString())
    }

    func on_tool_arguments(index: UInt32, fragment: RustString) {
        toolArguments(index, fragment.toString())
    }

    func on_tool_call(id: RustString, name: RustString, arguments: RustString) {
        toolCall(id.toString(), name.toString(), arguments.toString())
    }

    func on_reasoning(text: RustString) {
        reasoning(text.toString())
    }

    func on_done(
        finish_reason: UInt8, prompt_tokens: UInt64, completion_tokens: UInt64, cached_tokens: UInt64,
        reasoning_tokens: UInt64
    ) {
        done(finish_reason, prompt_tokens, completion_tokens, cached_tokens, reasoning_tokens)
    }

    func on_error(code: RustString, message: RustString) {
        error(code.toString(), message.toString())
    }
}

// Generated functions returning `Result<_, RustError>` throw the RustError itself.
extension RustError: Error {}

/// Hears about a model download while an engine loads (`load_engine_reporting`), on the loading
/// thread. `onProgress` gets the phase (0 waiting, 1 downloading, 2 verifying, 3 extracting,
/// 4 done), bytes done and bytes in all (0 when unknown); returning `true` cancels the download.
public final class ProgressSink {
    let report: (UInt8, UInt64, UInt64) -> Bool

    public init(onProgress: @escaping (UInt8, UInt64, UInt64) -> Bool) {
        report = onProgress
    }

    func on_progress(phase: UInt8, downloaded: UInt64, total: UInt64) -> Bool {
        report(phase, downloaded, total)
    }
}
