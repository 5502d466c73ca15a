// Hand-written companions of the generated glue in Generated/ (which rust/build.rs rewrites).

/// Receives one request's events. The Rust side calls these methods on the engine's thread, so
/// the closures must not block (Weft's closures append to the request's own stream buffer).
public final class EventSink {
    let token: (UInt32, String) -> Void
    let done: (UInt8, UInt64, UInt64, UInt64) -> Void
    let error: (String, String) -> Void

    /// - Parameters:
    ///   - onToken: a token id and the text it completes (possibly empty).
    ///   - onDone: finish reason (0 stop, 1 length, 2 cancelled), prompt, completion and cached
    ///     token counts. Final.
    ///   - onError: an error code and message. Final.
    public init(
        onToken: @escaping (UInt32, String) -> Void,
        onDone: @escaping (UInt8, UInt64, UInt64, UInt64) -> Void,
        onError: @escaping (String, String) -> Void
    ) {
        token = onToken
        done = onDone
        error = onError
    }

    func on_token(token_id: UInt32, text: RustString) {
        token(token_id, text.toString())
    }

    func on_done(finish_reason: UInt8, prompt_tokens: UInt64, completion_tokens: UInt64, cached_tokens: UInt64) {
        done(finish_reason, prompt_tokens, completion_tokens, cached_tokens)
    }

    func on_error(code: RustString, message: RustString) {
        error(code.toString(), message.toString())
    }
}

// Generated functions returning `Result<_, RustError>` throw the RustError itself.
extension RustError: Error {}
