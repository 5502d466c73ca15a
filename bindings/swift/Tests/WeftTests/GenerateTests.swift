import XCTest
@testable import Weft

/// Generation through the Swift package equals mlx-lm's goldens, alone and concurrently.
final class GenerateTests: XCTestCase {
    func testModelInfo() throws {
        let info = try Shared.get().modelInfo
        XCTAssertEqual(info.modelType, "llama")
        XCTAssertEqual(info.vocabSize, 1024)
        XCTAssertEqual(info.numLayers, 3)
        XCTAssertFalse(info.hasTokenizer)
        XCTAssertEqual(info.path, modelDir)
    }

    func testGreedyStreamEqualsGoldens() async throws {
        let engine = try Shared.get()
        for g in Goldens.shared.singles {
            let generation = engine.generate(promptIds: g.promptIds, options: greedy(g.tokens.count))
            let (ids, _) = try await collect(generation)
            XCTAssertEqual(ids, g.tokens)
            let c = try await generation.completion()
            XCTAssertEqual(c.finishReason, .length)
            XCTAssertEqual(c.tokenIds, g.tokens)
            // The shared engine's prompt cache (on by default) may hold a prefix of the prompt.
            XCTAssertEqual(c.usage, Usage(promptTokens: g.promptIds.count, completionTokens: g.tokens.count, cachedTokens: c.usage.cachedTokens))
            XCTAssertLessThan(c.usage.cachedTokens, g.promptIds.count)
            XCTAssertEqual(try generation.summary, c)
        }
    }

    func testQuantizedKvEngineStreamsAndBatches() async throws {
        let engine = try Engine(options: .init(model: modelDir, maxBatch: 4, kvBits: 8, kvGroupSize: 32))
        defer { engine.close() }
        let results = try await withThrowingTaskGroup(of: Completion.self) { group in
            for g in Goldens.shared.singles.prefix(3) {
                group.addTask { try await engine.complete(promptIds: g.promptIds, options: greedy(24)) }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        XCTAssertEqual(results.count, 3)
        for c in results {
            XCTAssertEqual(c.tokenIds.count, 24)
            XCTAssertEqual(c.finishReason, .length)
        }
    }

    /// A draft model (here the model drafting for itself) keeps greedy output on the goldens and
    /// reports its drafts in the stats.
    func testDraftModelKeepsGreedyGoldens() async throws {
        let engine = try Engine(options: .init(model: modelDir, maxBatch: 4, draftModel: modelDir))
        defer { engine.close() }
        for g in Goldens.shared.singles.prefix(2) {
            let c = try await engine.complete(promptIds: g.promptIds, options: greedy(g.tokens.count))
            XCTAssertEqual(c.tokenIds, g.tokens)
        }
        try await waitIdle(engine)
        let s = engine.stats()
        XCTAssertGreaterThan(s.speculativeSteps, 0)
        XCTAssertGreaterThan(s.draftTokens, 0)
        XCTAssertLessThanOrEqual(s.draftTokensAccepted, s.draftTokens)
        await assertWeftError(.invalidArgument) {
            try Engine(options: .init(model: modelDir, draftModel: ""))
        }
    }

    func testCompleteEqualsGoldens() async throws {
        let engine = try Shared.get()
        let g = Goldens.shared.singles[2]
        let c = try await engine.complete(promptIds: g.promptIds, options: greedy(g.tokens.count))
        XCTAssertEqual(c.tokenIds, g.tokens)
        XCTAssertEqual(c.finishReason, .length)
        XCTAssertEqual(c.usage.completionTokens, g.tokens.count)
    }

    func testFourConcurrentStreamsBatchTogether() async throws {
        let engine = try Shared.get()
        let rows = Array((Goldens.shared.batchRows + Goldens.shared.singles).prefix(4))
        XCTAssertEqual(rows.count, 4)
        try await waitIdle(engine)
        let before = engine.stats()
        // generate() submits at once; four tasks then read the four streams concurrently.
        let generations = rows.map { engine.generate(promptIds: $0.promptIds, options: greedy($0.tokens.count)) }
        let outputs = try await withThrowingTaskGroup(of: (Int, [Int]).self) { group in
            for (i, generation) in generations.enumerated() {
                group.addTask { (i, try await collect(generation).ids) }
            }
            var out = [[Int]](repeating: [], count: rows.count)
            for try await (i, ids) in group { out[i] = ids }
            return out
        }
        for (i, r) in rows.enumerated() {
            XCTAssertEqual(outputs[i], r.tokens, "row \(i)")
        }
        try await waitFor("the batch to drain") {
            let s = engine.stats()
            return s.activeRows == 0 && s.requestsFinished == before.requestsFinished + 4
        }
        let after = engine.stats()
        // Batched: fewer decode steps than tokens (one step decodes every active row).
        let tokens = after.tokensGenerated - before.tokensGenerated
        let steps = after.decodeSteps - before.decodeSteps
        XCTAssertGreaterThanOrEqual(Int(tokens), rows.reduce(0) { $0 + $1.tokens.count } - 4)
        XCTAssertLessThan(steps * 2, tokens, "\(steps) decode steps for \(tokens) tokens: not batched")
    }

    func testEngineIsSendableAcrossTasks() async throws {
        let engine = try Shared.get()
        let g = Goldens.shared.singles[0]
        // Detached tasks on other threads share the one engine.
        let results = try await withThrowingTaskGroup(of: [Int].self) { group in
            for _ in 0..<3 {
                group.addTask { try await Task.detached { try await engine.complete(promptIds: g.promptIds, options: greedy(8)).tokenIds }.value }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        XCTAssertEqual(results, Array(repeating: Array(g.tokens.prefix(8)), count: 3))
    }
}
