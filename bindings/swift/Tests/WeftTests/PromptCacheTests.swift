import Foundation
import XCTest
@testable import Weft

/// Prompt-cache entries saved to a file and loaded into a new engine: the same prompt then reuses
/// the entry and still equals mlx-lm's golden trajectory; missing, corrupt and other-model files
/// are refused with their codes; the stats report the cache's counters.
final class PromptCacheTests: XCTestCase {
    func testAnEntrySavedByOneEngineServesANewOneExactly() async throws {
        let g = Goldens.shared.singles[1]
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("weft-swift-cache-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let file = dir.appendingPathComponent("entry.safetensors").path

        let first = try Engine(options: .init(model: modelDir, promptCacheBytes: 64 << 20))
        await assertWeftError(.notFound) { try first.savePromptCache(to: file) }
        let cold = try await first.complete(promptIds: g.promptIds, options: greedy(g.tokens.count))
        XCTAssertEqual(cold.tokenIds, g.tokens)
        let saved = try first.savePromptCache(to: file)
        XCTAssertGreaterThanOrEqual(saved.tokens, g.promptIds.count)
        let part = try first.savePromptCache(to: dir.appendingPathComponent("prefix.safetensors").path, promptIds: Array(g.promptIds.prefix(5)))
        XCTAssertEqual(part.tokens, 5)
        first.close()

        let second = try Engine(options: .init(model: modelDir, promptCacheBytes: 64 << 20))
        XCTAssertEqual(try second.loadPromptCache(from: file), saved)
        try await waitFor("the entry in the stats") { second.stats().promptCacheEntries == 1 }
        XCTAssertEqual(second.stats().promptCacheCapacityBytes, 64 << 20)
        let warm = try await second.complete(promptIds: g.promptIds, options: greedy(g.tokens.count))
        XCTAssertEqual(warm.tokenIds, g.tokens)
        XCTAssertEqual(warm.usage.cachedTokens, g.promptIds.count - 1)
        try await waitFor("the hit in the stats") { second.stats().promptCacheHits == 1 }
        XCTAssertEqual(second.stats().promptCacheCachedTokens, UInt64(g.promptIds.count - 1))
        XCTAssertEqual(second.stats().promptCacheFilesRefused, 0)

        await assertWeftError(.notFound) { try second.loadPromptCache(from: dir.appendingPathComponent("missing.safetensors").path) }
        let bad = dir.appendingPathComponent("bad.safetensors")
        try Data("not a cache file".utf8).write(to: bad)
        let e = await assertWeftError(.invalidArgument) { try second.loadPromptCache(from: bad.path) }
        XCTAssertTrue(e?.message.contains("prompt-cache file") ?? false, "\(String(describing: e))")
        second.close()
        await assertWeftError(.engineClosed) { try second.loadPromptCache(from: file) }

        let other = try Engine(options: .init(model: repoRoot.appendingPathComponent("goldens/models/llama-bf16").path, promptCacheBytes: 64 << 20))
        let refused = await assertWeftError(.invalidArgument) { try other.loadPromptCache(from: file) }
        XCTAssertTrue(refused?.message.contains("saved for another") ?? false, "\(String(describing: refused))")
        other.close()
    }
}
