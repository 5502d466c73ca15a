import XCTest
@testable import Weft

/// Failures surface as `WeftError` with a code and a message.
final class ErrorTests: XCTestCase {
    func testBadModelPathThrows() async throws {
        let path = repoRoot.appendingPathComponent("goldens/models/no-such-model").path
        let e = await assertWeftError(.modelLoad) { try Engine(options: .init(model: path)) }
        XCTAssertTrue(e?.message.contains("no-such-model") ?? false, e?.message ?? "")
        let m = await assertWeftError(.invalidArgument) { try Engine(options: .init(model: modelDir, maxBatch: 0)) }
        XCTAssertTrue(m?.message.contains("maxBatch must be an integer in [1, 4096], got 0") ?? false, m?.message ?? "")
        let z = await assertWeftError(.invalidArgument) { try Engine(options: .init(model: modelDir, memoryLimitBytes: 0)) }
        XCTAssertTrue(z?.message.contains("memoryLimitBytes must be an integer >= 1, got 0") ?? false, z?.message ?? "")
        await assertWeftError(.invalidArgument) { try Engine(options: .init(model: modelDir, kvBits: 7)) }
        let a = await assertWeftError(.invalidArgument) { try Engine(options: .init(model: modelDir, cpuActivations: "int4")) }
        XCTAssertTrue(a?.message.contains("cpuActivations must be one of \"float\", \"int8\", got \"int4\"") ?? false, a?.message ?? "")
        // The tiny model's head size is 32: the default KV group of 64 cannot quantize it.
        let g = await assertWeftError(.invalidArgument) { try Engine(options: .init(model: modelDir, kvBits: 4)) }
        XCTAssertTrue(g?.message.contains("head_dim") ?? false, g?.message ?? "")
    }

    func testBadRequestsThrowFromTheStream() async throws {
        let engine = try Shared.get()
        // A token id outside the vocabulary.
        let e = await assertWeftError(.invalidArgument) { try await collect(engine.generate(promptIds: [5000], options: greedy(4))) }
        XCTAssertTrue(e?.message.contains("5000") ?? false, e?.message ?? "")
        let zero = await assertWeftError(.invalidArgument) { try await engine.complete(promptIds: [1, 2], options: greedy(0)) }
        XCTAssertTrue(zero?.message.contains("maxTokens must be an integer in [1, 4294967295], got 0") ?? false, zero?.message ?? "")
        let top = await assertWeftError(.invalidArgument) {
            try await engine.complete(promptIds: [1], options: .init(topLogprobs: 2))
        }
        XCTAssertTrue(top?.message.contains("topLogprobs needs logprobs: true") ?? false, top?.message ?? "")
        let inf = await assertWeftError(.invalidArgument) {
            try await engine.complete(promptIds: [1], options: .init(temperature: .infinity))
        }
        XCTAssertTrue(inf?.message.contains("temperature must be a finite number >= 0, got \"Infinity\"") ?? false, inf?.message ?? "")
        // -infinity bans a token: greedy from the golden prompt no longer starts with its first token.
        let g0 = Goldens.shared.singles[0]
        let banned = try await engine.complete(
            promptIds: g0.promptIds, options: .init(maxTokens: 1, logitBias: [g0.tokens[0]: -.infinity], ignoreEos: true))
        XCTAssertNotEqual(banned.tokenIds.first, g0.tokens[0])
        await assertWeftError(.invalidArgument) { try await engine.complete(promptIds: [], options: greedy(4)) }
        let neg = await assertWeftError(.invalidArgument) { try await engine.complete(promptIds: [-1], options: greedy(4)) }
        XCTAssertTrue(neg?.message.contains("promptIds[0] must be a token id") ?? false, neg?.message ?? "")
        await assertWeftError(.invalidArgument) {
            try await engine.complete(promptIds: [1], options: .init(maxTokens: 4, temperature: -1))
        }
        // This model has no tokenizer: text prompts are refused.
        let t = await assertWeftError(.invalidArgument) { try await engine.complete(prompt: "Hello", options: greedy(4)) }
        XCTAssertTrue(t?.message.contains("tokenizer") ?? false, t?.message ?? "")
        await assertWeftError(.invalidArgument) { try await collect(engine.generate(messages: [.user("Hi")])) }
        // The engine still serves good requests.
        let g = Goldens.shared.singles[0]
        let c = try await engine.complete(promptIds: g.promptIds, options: greedy(4))
        XCTAssertEqual(c.tokenIds, Array(g.tokens.prefix(4)))
    }

    func testClosedEngine() async throws {
        let engine = try Engine(options: .init(model: modelDir, maxBatch: 2))
        let g = Goldens.shared.singles[0]
        let running = engine.generate(promptIds: g.promptIds, options: greedy(1500))
        var it = running.makeAsyncIterator()
        _ = try await it.next()
        engine.close()
        XCTAssertTrue(engine.isClosed)
        // Outstanding requests end as cancelled; new ones are refused.
        let c = try await running.completion()
        XCTAssertEqual(c.finishReason, .cancelled)
        await assertWeftError(.engineClosed) { try await engine.complete(promptIds: g.promptIds, options: greedy(4)) }
        engine.close()
    }
}
