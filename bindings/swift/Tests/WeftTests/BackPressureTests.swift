import XCTest
@testable import Weft

/// A consumer that stops reading parks only its own row, which resumes where it stopped.
final class BackPressureTests: XCTestCase {
    let long = 1200

    func testAnUnreadStreamPausesItsRowAndResumesWhenRead() async throws {
        let engine = try Shared.get()
        try await waitIdle(engine)
        let g = Goldens.shared.singles[0]
        let other = Goldens.shared.singles[1]
        let reference = try await engine.complete(promptIds: g.promptIds, options: greedy(long))

        let stalled = engine.generate(promptIds: g.promptIds, options: greedy(long))
        try await waitFor("the unread row to be paused") { engine.stats().pausedRows == 1 }
        // Paused: the engine stops producing for it, and the buffer stays near the high-water mark.
        let before = engine.stats().tokensGenerated
        // Another row runs to the end meanwhile.
        let (ids, _) = try await collect(engine.generate(promptIds: other.promptIds, options: greedy(other.tokens.count)))
        XCTAssertEqual(ids, other.tokens)
        // Stats are published after each step: wait for the other row's last one.
        try await waitFor("the other row's tokens in the stats") {
            engine.stats().tokensGenerated - before >= UInt64(other.tokens.count)
        }
        XCTAssertEqual(engine.stats().tokensGenerated - before, UInt64(other.tokens.count))
        XCTAssertEqual(engine.stats().pausedRows, 1)

        // Reading it resumes the row; its trajectory is the unstalled one.
        let (stalledIds, stalledText) = try await collect(stalled)
        XCTAssertEqual(stalledIds, reference.tokenIds)
        XCTAssertEqual(stalledText, reference.text)
        let c = try await stalled.completion()
        XCTAssertEqual(c.finishReason, .length)
        XCTAssertEqual(engine.stats().pausedRows, 0)
        try await waitIdle(engine)
    }

    func testCompletionWithoutReadingNeverPauses() async throws {
        let engine = try Shared.get()
        try await waitIdle(engine)
        let g = Goldens.shared.singles[2]
        // More chunks than the high-water mark, none read through the stream.
        let generation = engine.generate(promptIds: g.promptIds, options: greedy(RowState.highWater * 2))
        let c = try await generation.completion()
        XCTAssertEqual(c.usage.completionTokens, RowState.highWater * 2)
        XCTAssertEqual(c.finishReason, .length)
        try await waitIdle(engine)
    }
}
