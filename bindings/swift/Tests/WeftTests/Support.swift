import Foundation
import XCTest
@testable import Weft

/// The repository root (Tests/WeftTests → bindings/swift → bindings → root).
let repoRoot = URL(fileURLWithPath: #filePath)
    .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    .deletingLastPathComponent().deletingLastPathComponent()

/// The tiny random-weight llama of goldens/ (no tokenizer: prompts are token ids).
let modelDir = repoRoot.appendingPathComponent("goldens/models/llama-fp32").path

struct Trajectory {
    let promptIds: [Int]
    let tokens: [Int]
}

/// mlx-lm 0.32.2's greedy trajectories for the model (goldens/llama-fp32.json): single-sequence
/// runs (24 tokens, EOS ignored) and the rows of its batch_generate runs.
struct Goldens {
    let singles: [Trajectory]
    let batchRows: [Trajectory]
    /// mlx-lm's log-probabilities at the first step of each single run (the whole vocabulary).
    let firstLogprobs: [[Double]]

    static let shared: Goldens = {
        let url = repoRoot.appendingPathComponent("goldens/llama-fp32.json")
        guard let data = try? Data(contentsOf: url),
              let json = try? JSONSerialization.jsonObject(with: data) as? [String: Any],
              let single = json["single"] as? [[String: Any]],
              let batch = json["batch"] as? [[String: Any]]
        else { fatalError("cannot read \(url.path)") }
        func trajectory(_ o: [String: Any]) -> Trajectory {
            Trajectory(promptIds: o["prompt_ids"] as! [Int], tokens: o["tokens"] as! [Int])
        }
        let rows = batch.flatMap { ($0["rows"] as! [[String: Any]]).map(trajectory) }
        let first = single.map { $0["first_logprobs"] as! [Double] }
        return Goldens(singles: single.map(trajectory), batchRows: rows, firstLogprobs: first)
    }()
}

/// One engine for the whole suite (loading is the slow part), like an app would share it.
enum Shared {
    private static let lock = NSLock()
    private static var engine: Engine?

    static func get() throws -> Engine {
        lock.lock()
        defer { lock.unlock() }
        if let e = engine { return e }
        let e = try Engine(options: .init(model: modelDir, maxBatch: 8))
        engine = e
        return e
    }
}

/// Polls `condition` (stats are published after each engine step).
func waitFor(_ what: String, timeout: TimeInterval = 10, _ condition: () -> Bool) async throws {
    let end = Date().addingTimeInterval(timeout)
    while !condition() {
        if Date() > end { throw WeftError(code: .init(rawValue: "TEST_TIMEOUT"), message: "timed out waiting for \(what)") }
        try await Task.sleep(nanoseconds: 5_000_000)
    }
}

/// Waits until no request is queued or running and the published stats have settled (they are
/// published after each engine step, so a snapshot can lag the last event by one step).
func waitIdle(_ engine: Engine) async throws {
    var last: EngineStats?
    var stable = 0
    try await waitFor("an idle engine") {
        let s = engine.stats()
        let idle = s.activeRows == 0 && s.queuedRows == 0 && s.prefillingRows == 0
        stable = idle && s == last ? stable + 1 : 0
        last = s
        return stable >= 4
    }
}

func collect(_ generation: Generation) async throws -> (ids: [Int], text: String) {
    var ids: [Int] = []
    var text = ""
    for try await chunk in generation {
        if let id = chunk.tokenId { ids.append(id) }
        text += chunk.text
    }
    return (ids, text)
}

let greedy = { (n: Int) in GenerateOptions(maxTokens: n, ignoreEos: true) }

/// Asserts that `body` throws a `WeftError` with `code`, and returns it.
@discardableResult
func assertWeftError<T>(
    _ code: WeftError.Code, _ body: () async throws -> T, file: StaticString = #filePath, line: UInt = #line
) async -> WeftError? {
    do {
        _ = try await body()
        XCTFail("expected WeftError(\(code)), nothing was thrown", file: file, line: line)
    } catch let e as WeftError {
        XCTAssertEqual(e.code, code, "\(e)", file: file, line: line)
        XCTAssertFalse(e.message.isEmpty, file: file, line: line)
        return e
    } catch {
        XCTFail("expected WeftError(\(code)), got \(error)", file: file, line: line)
    }
    return nil
}
