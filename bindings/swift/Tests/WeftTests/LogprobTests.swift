import XCTest
@testable import Weft

/// `logprobs` / `topLogprobs` reach chunks and completions, equal to mlx-lm's first step.
final class LogprobTests: XCTestCase {
    func testChunksAndCompletionCarryLogprobs() async throws {
        let engine = try Shared.get()
        let g = Goldens.shared.singles[0]
        let first = try XCTUnwrap(Goldens.shared.firstLogprobs.first)
        var chunks: [Chunk] = []
        let options = GenerateOptions(maxTokens: 4, ignoreEos: true, logprobs: true, topLogprobs: 3)
        for try await c in engine.generate(promptIds: g.promptIds, options: options) { chunks.append(c) }
        XCTAssertEqual(chunks.map(\.tokenId), g.tokens.prefix(4).map { Optional($0) })
        let want = first.enumerated().sorted { $0.element > $1.element || ($0.element == $1.element && $0.offset < $1.offset) }.prefix(3)
        let c0 = chunks[0]
        XCTAssertEqual(try XCTUnwrap(c0.logprob), first[g.tokens[0]], accuracy: 1e-4)
        XCTAssertEqual(c0.topLogprobs?.map(\.tokenId), want.map(\.offset))
        for c in chunks {
            let top = try XCTUnwrap(c.topLogprobs)
            XCTAssertEqual(top.count, 3)
            XCTAssertEqual(top[0].tokenId, c.tokenId)
            XCTAssertEqual(top[0].logprob, try XCTUnwrap(c.logprob), accuracy: 1e-6)
        }
        let done = try await engine.complete(promptIds: g.promptIds, options: .init(maxTokens: 3, ignoreEos: true, logprobs: true))
        XCTAssertEqual(done.logprobs?.map(\.tokenId), done.tokenIds)
        XCTAssertEqual(done.logprobs?.first?.topLogprobs, [])
        let plain = try await engine.complete(promptIds: g.promptIds, options: greedy(2))
        XCTAssertNil(plain.logprobs)
    }
}
