import Foundation
import WeftBridge

/// The token stream of one `generate` call: `for try await chunk in generation { ... }`.
///
/// Chunks are buffered per request, up to `RowState.highWater` unread; past that the engine pauses
/// the row (it leaves the batch, keeping its KV cache, while other rows go on) until the consumer
/// has caught up to `RowState.lowWater`, so a slow consumer only delays itself and never makes
/// the buffer grow without bound. `completion()` turns the pause off (nothing is left unread
/// there). Leaving the loop early (`break`, `return`, a thrown error), cancelling the
/// consuming task, calling `cancel()`, or releasing an unfinished generation that nobody
/// iterates cancels the request in the engine; the stream then simply ends. A failure throws a
/// `WeftError`. Iterate a generation once.
public struct Generation: AsyncSequence, Sendable {
    public typealias Element = Chunk

    let state: RowState
    let owner: Owner

    init(state: RowState) {
        self.state = state
        owner = Owner(state)
    }

    public func makeAsyncIterator() -> Iterator {
        Iterator(base: state.stream.makeAsyncIterator(), guard_: IterationGuard(state), owner: owner)
    }

    public struct Iterator: AsyncIteratorProtocol {
        var base: AsyncThrowingStream<Chunk, Error>.Iterator
        let guard_: IterationGuard
        let owner: Owner

        public mutating func next() async throws -> Chunk? {
            let chunk = try await base.next()
            if chunk != nil { guard_.state.consumed() }
            return chunk
        }
    }

    /// Cancels the request; chunks already produced can still be read, then the stream ends and
    /// `completion()` reports `.cancelled`.
    public func cancel() {
        state.cancel()
    }

    /// Waits for the end of the request and returns its text, token ids, finish reason and usage
    /// (whether or not the stream was read). Cancelling the waiting task cancels the request.
    public func completion() async throws -> Completion {
        let state = self.state
        let owner = self.owner
        state.stopBackPressure()
        let result = try await withTaskCancellationHandler {
            try await state.result()
        } onCancel: {
            state.cancel()
        }
        // Releasing the owner earlier would cancel the request being waited for.
        withExtendedLifetime(owner) {}
        return result
    }

    /// The result once the engine has finished the request (chunks may still be buffered), else
    /// `nil`. Throws the request's error if it failed.
    public var summary: Completion? {
        get throws { try state.summary() }
    }
}

/// Cancels the request when the last copy of its `Generation` (and every iterator) is released
/// before the end.
final class Owner: @unchecked Sendable {
    let state: RowState
    init(_ state: RowState) { self.state = state }
    deinit { state.cancel() }
}

/// Cancels the request when an iterator is dropped before the end: `break` out of `for await`.
final class IterationGuard: @unchecked Sendable {
    let state: RowState
    init(_ state: RowState) { self.state = state }
    deinit { state.cancel() }
}

/// One request's state, shared by the engine thread (through `EventSink`) and consumers.
final class RowState: @unchecked Sendable {
    private let lock = NSLock()
    let stream: AsyncThrowingStream<Chunk, Error>
    private let continuation: AsyncThrowingStream<Chunk, Error>.Continuation
    private var row: RustRow?
    private var cancelRequested = false
    private var text = ""
    private var reasoningText = ""
    /// Reasoning text of the chunk whose `token` call comes next.
    private var pendingReasoning = ""
    private var tokenIds: [Int] = []
    /// Per token when the request asked for log-probabilities.
    private var logprobs: [TokenLogprobs]?
    /// The alternatives of the token whose `token` call comes next.
    private var pendingTop: [TokenLogprob] = []
    /// Tool-call pieces of the chunk whose `token` call comes next.
    private var pendingDeltas: [ToolCallDelta] = []
    /// The complete calls, from the engine right before `done`.
    private var toolCalls: [ToolCall] = []
    private var outcome: Result<Completion, WeftError>?
    private var waiters: [CheckedContinuation<Completion, Error>] = []
    /// Chunks yielded and not yet read by an iterator.
    private var unread = 0
    private var paused = false
    /// Set by `completion()`: the row runs to the end whether or not anyone reads the stream.
    private var unbounded = false

    /// Unread chunks at which the row is paused, and at which it resumes: the engine's own
    /// watermarks (the ones every face uses).
    static let highWater = Int(flow_pause_at())
    static let lowWater = Int(flow_resume_at())

    init(logprobs: Bool = false) {
        self.logprobs = logprobs ? [] : nil
        var c: AsyncThrowingStream<Chunk, Error>.Continuation!
        stream = AsyncThrowingStream(bufferingPolicy: .unbounded) { c = $0 }
        continuation = c
        // A cancelled consuming task ends the stream; the engine must drop the row too.
        continuation.onTermination = { [weak self] termination in
            if case .cancelled = termination { self?.cancel() }
        }
    }

    func attach(_ row: RustRow) {
        lock.lock()
        let cancelNow = cancelRequested && outcome == nil
        let pauseNow = paused && outcome == nil
        self.row = row
        lock.unlock()
        if cancelNow { row.cancel() }
        if pauseNow { row.pause() }
    }

    // Consumer side: one chunk read.
    func consumed() {
        lock.lock()
        unread -= 1
        let resume = paused && unread <= RowState.lowWater
        if resume { paused = false }
        let row = self.row
        lock.unlock()
        if resume { row?.resume() }
    }

    func stopBackPressure() {
        lock.lock()
        unbounded = true
        let resume = paused
        paused = false
        let row = self.row
        lock.unlock()
        if resume { row?.resume() }
    }

    func cancel() {
        lock.lock()
        cancelRequested = true
        let row = outcome == nil ? self.row : nil
        lock.unlock()
        row?.cancel()
    }

    /// The id the Rust half passes with text held back until the request ended (no token).
    static let noToken = Int(UInt32.max)

    // Engine thread: one of the next token's top alternatives (they come before it).
    func topLogprob(_ id: Int, _ logprob: Double) {
        lock.lock()
        pendingTop.append(TokenLogprob(tokenId: id, logprob: logprob))
        lock.unlock()
    }

    // Engine thread: a piece of a tool call (it comes before its chunk's `token`).
    func toolDelta(_ delta: ToolCallDelta) {
        lock.lock()
        pendingDeltas.append(delta)
        lock.unlock()
    }

    // Engine thread: reasoning text (it comes before its chunk's `token`).
    func reasoning(_ piece: String) {
        lock.lock()
        pendingReasoning += piece
        lock.unlock()
    }

    // Engine thread: a complete call (they come right before `done`).
    func toolCall(_ call: ToolCall) {
        lock.lock()
        toolCalls.append(call)
        lock.unlock()
    }

    // Engine thread. `logprob`: NaN unless the request asked for log-probabilities.
    func token(_ id: Int, _ piece: String, _ logprob: Double) {
        let tokenId: Int? = id == RowState.noToken ? nil : id
        lock.lock()
        text += piece
        let thought = pendingReasoning
        pendingReasoning = ""
        reasoningText += thought
        let top = pendingTop
        pendingTop = []
        let deltas = pendingDeltas
        pendingDeltas = []
        var scored: TokenLogprobs?
        if let tokenId {
            tokenIds.append(tokenId)
            if !logprob.isNaN {
                scored = TokenLogprobs(tokenId: tokenId, logprob: logprob, topLogprobs: top)
                logprobs?.append(scored!)
            }
        }
        unread += 1
        let pause = !paused && !unbounded && unread >= RowState.highWater
        if pause { paused = true }
        let row = self.row
        lock.unlock()
        // Pausing only sets the row's flag; the engine parks it at its next step.
        if pause { row?.pause() }
        continuation.yield(
            Chunk(
                text: piece, tokenId: tokenId, logprob: scored?.logprob, topLogprobs: scored?.topLogprobs, toolCalls: deltas,
                reasoning: thought))
    }

    // Engine thread.
    func done(reason: UInt8, prompt: UInt64, completion: UInt64, cached: UInt64, reasoning: UInt64) {
        let finish: FinishReason
        switch reason {
        case 0: finish = .stop
        case 1: finish = .length
        case 3: finish = .toolCalls
        default: finish = .cancelled
        }
        lock.lock()
        let result = Completion(
            text: text,
            tokenIds: tokenIds,
            finishReason: finish,
            usage: Usage(
                promptTokens: Int(prompt), completionTokens: Int(completion), cachedTokens: Int(cached),
                reasoningTokens: Int(reasoning)),
            logprobs: logprobs,
            toolCalls: toolCalls,
            reasoning: reasoningText
        )
        let waiting = settle(.success(result))
        lock.unlock()
        continuation.finish()
        for w in waiting { w.resume(returning: result) }
    }

    // Engine thread, or the submitting thread for a rejected request.
    func fail(_ error: WeftError) {
        lock.lock()
        let waiting = settle(.failure(error))
        lock.unlock()
        continuation.finish(throwing: error)
        for w in waiting { w.resume(throwing: error) }
    }

    /// Records the outcome (under the lock) and returns the waiters to resume.
    private func settle(_ result: Result<Completion, WeftError>) -> [CheckedContinuation<Completion, Error>] {
        outcome = result
        let waiting = waiters
        waiters = []
        return waiting
    }

    func result() async throws -> Completion {
        try await withCheckedThrowingContinuation { (c: CheckedContinuation<Completion, Error>) in
            lock.lock()
            if let outcome {
                lock.unlock()
                c.resume(with: outcome.mapError { $0 as Error })
            } else {
                waiters.append(c)
                lock.unlock()
            }
        }
    }

    func summary() throws -> Completion? {
        lock.lock()
        defer { lock.unlock() }
        return try outcome?.get()
    }
}
