import Foundation
import XCTest
@testable import Weft

/// A Hugging Face repo id loaded from the local Hub that scripts/swift-test starts
/// (scripts/local_hub.py; HF_ENDPOINT, WEFT_TEST_HUB and an empty HF_HUB_CACHE are set): a
/// progress handler cancels, `Engine.load` streams the resumed download up to `.done` and then the
/// engine, and a cached model reports no download.
final class DownloadTests: XCTestCase {
    final class Reports: @unchecked Sendable {
        var phases: [DownloadProgress.Phase] = []
        var overshoot = 0
        func add(_ p: DownloadProgress) {
            phases.append(p.phase)
            if let total = p.total, p.downloaded > total { overshoot += 1 }
        }
    }

    func testRepoIdDownloadsWithProgressCancelsAndLoadsFromTheCache() async throws {
        guard ProcessInfo.processInfo.environment["WEFT_TEST_HUB"] != nil else {
            return XCTFail("WEFT_TEST_HUB is not set: run the suite through scripts/swift-test")
        }
        let options = Engine.Options(model: "org/tiny")

        let cancelled = Reports()
        let e = await assertWeftError(.cancelled) {
            try Engine(options: options) { p in
                cancelled.add(p)
                return p.phase != .downloading
            }
        }
        XCTAssertTrue(e?.message.contains("cancel") ?? false, e?.message ?? "")
        XCTAssertEqual(cancelled.phases.filter { $0 == .downloading }.count, 1, "\(cancelled.phases)")

        let resumed = Reports()
        var loaded: Engine?
        for try await event in Engine.load(options: options) {
            switch event {
            case .progress(let p): resumed.add(p)
            case .loaded(let engine): loaded = engine
            }
        }
        let engine = try XCTUnwrap(loaded)
        XCTAssertTrue(resumed.phases.contains(.downloading), "\(resumed.phases)")
        XCTAssertEqual(resumed.phases.last, .done)
        XCTAssertEqual(resumed.overshoot, 0)
        XCTAssertTrue(engine.modelInfo.path.contains("models--org--tiny"), engine.modelInfo.path)
        let r = try await engine.complete(promptIds: [5, 17, 3], options: .init(maxTokens: 2, ignoreEos: true))
        XCTAssertEqual(r.tokenIds.count, 2)
        engine.close()

        let cached = Reports()
        let again = try Engine(options: options) { p in
            cached.add(p)
            return true
        }
        again.close()
        XCTAssertFalse(cached.phases.contains(.downloading), "\(cached.phases)")

        await assertWeftError(.modelLoad) { try Engine(options: .init(model: "org/no-such-repo")) }
    }
}
