import XCTest
@testable import Weft

/// Cancellation reaches the engine: leaving the loop, cancelling the consuming task, cancel().
final class CancelTests: XCTestCase {
    // Long enough that cancellation, not maxTokens, ends a request.
    let long = 1500

    func testBreakingOutOfTheLoopCancelsTheRow() async throws {
        let engine = try Shared.get()
        try await waitIdle(engine)
        let g = Goldens.shared.singles[0]
        let generation = engine.generate(promptIds: g.promptIds, options: greedy(long))
        var n = 0
        for try await chunk in generation {
            XCTAssertEqual(chunk.tokenId, g.tokens[n])
            n += 1
            if n == 2 { break }
        }
        // The generation value is still alive: only the dropped iterator cancelled the row.
        let c = try await generation.completion()
        XCTAssertEqual(c.finishReason, .cancelled)
        XCTAssertLessThan(c.usage.completionTokens, long)
        XCTAssertEqual(Array(c.tokenIds.prefix(2)), Array(g.tokens.prefix(2)))
        try await waitIdle(engine)
    }

    func testCancellingTheConsumingTaskCancelsTheRow() async throws {
        let engine = try Shared.get()
        try await waitIdle(engine)
        let g = Goldens.shared.singles[1]
        let other = Goldens.shared.singles[2]
        let generation = engine.generate(promptIds: g.promptIds, options: greedy(long))
        let untouched = engine.generate(promptIds: other.promptIds, options: greedy(other.tokens.count))
        let firstTokens = AsyncStream<Void>.makeStream()
        let consumer = Task {
            var n = 0
            for try await _ in generation {
                n += 1
                if n == 3 { firstTokens.continuation.yield() }
            }
            return n
        }
        for await _ in firstTokens.stream { break }
        consumer.cancel()
        let consumed = try await consumer.value
        XCTAssertLessThan(consumed, long)
        let c = try await generation.completion()
        XCTAssertEqual(c.finishReason, .cancelled)
        XCTAssertLessThan(c.usage.completionTokens, long)
        // The row next to it is unaffected.
        let (ids, _) = try await collect(untouched)
        XCTAssertEqual(ids, other.tokens)
        try await waitIdle(engine)
    }

    func testCancellingACompleteTaskCancelsTheRow() async throws {
        let engine = try Shared.get()
        try await waitIdle(engine)
        let before = engine.stats()
        let g = Goldens.shared.singles[3]
        let task = Task { try await engine.complete(promptIds: g.promptIds, options: greedy(long)) }
        try await waitFor("the request to start decoding") { engine.stats().tokensGenerated > before.tokensGenerated }
        task.cancel()
        let c = try await task.value
        XCTAssertEqual(c.finishReason, .cancelled)
        XCTAssertLessThan(c.usage.completionTokens, long)
        try await waitIdle(engine)
    }

    func testCancelMethodAndReleasedGeneration() async throws {
        let engine = try Shared.get()
        try await waitIdle(engine)
        let g = Goldens.shared.singles[4]
        let generation = engine.generate(promptIds: g.promptIds, options: greedy(long))
        generation.cancel()
        let c = try await generation.completion()
        XCTAssertEqual(c.finishReason, .cancelled)
        try await waitIdle(engine)

        // Started, then released without being read to the end: cancelled.
        let before = engine.stats()
        do {
            let dropped = engine.generate(promptIds: g.promptIds, options: greedy(long))
            try await waitFor("the request to start decoding") { engine.stats().tokensGenerated > before.tokensGenerated }
            _ = dropped
        }
        try await waitFor("the dropped request to finish") {
            let s = engine.stats()
            return s.requestsFinished == before.requestsFinished + 1 && s.activeRows == 0 && s.queuedRows == 0
        }
        XCTAssertLessThan(engine.stats().tokensGenerated - before.tokensGenerated, UInt64(long))
    }

    func testReleasingEverythingMidStreamStopsTheEngine() async throws {
        let g = Goldens.shared.singles[0]
        weak var weakState: RowState?
        do {
            let engine = try Engine(options: .init(model: modelDir, maxBatch: 2))
            let generation = engine.generate(promptIds: g.promptIds, options: greedy(long))
            weakState = generation.state
            var it = generation.makeAsyncIterator()
            let first = try await it.next()
            XCTAssertEqual(first?.tokenId, g.tokens[0])
        }
        // The iterator and generation are gone: the row is cancelled, and the engine thread drops
        // the last reference to its own engine while delivering that (it must not join itself).
        try await waitFor("the request state to be released") { weakState == nil }
        // Other engines are unaffected.
        let c = try await Shared.get().complete(promptIds: g.promptIds, options: greedy(4))
        XCTAssertEqual(c.tokenIds, Array(g.tokens.prefix(4)))
    }
}
