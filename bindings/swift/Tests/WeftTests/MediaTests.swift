import Foundation
import XCTest
@testable import Weft

/// Audio through the Swift package on the tiny Gemma 4 audio model (goldens/models/gemma4-audio-lm):
/// a clip as bytes or as a path gives mlx-vlm's greedy tokens (goldens/audio_engine.json).
final class MediaTests: XCTestCase {
    func testAudioClipsGiveTheReferenceTokens() async throws {
        let url = repoRoot.appendingPathComponent("goldens/audio_engine.json")
        let json = try JSONSerialization.jsonObject(with: Data(contentsOf: url)) as! [String: Any]
        let cases = json["cases"] as! [[String: Any]]
        let clipCase = cases.first { ($0["name"] as? String) == "tones-44k-stereo" }!
        let clip = repoRoot.appendingPathComponent("goldens/" + (clipCase["clip"] as! String))
        let ids = clipCase["prompt_template_ids"] as! [Int]
        let want = clipCase["tokens"] as! [Int]

        let engine = try Engine(options: .init(model: repoRoot.appendingPathComponent("goldens/models/gemma4-audio-lm").path))
        defer { engine.close() }
        XCTAssertTrue(engine.modelInfo.audio)
        XCTAssertFalse(engine.modelInfo.vision)
        let bytes = try await engine.complete(promptIds: ids, options: .init(maxTokens: 16, ignoreEos: true, audio: [.bytes(Data(contentsOf: clip))]))
        XCTAssertEqual(bytes.tokenIds, want)
        let path = try await engine.complete(promptIds: ids, options: .init(maxTokens: 16, ignoreEos: true, audio: [.file(clip.path)]))
        XCTAssertEqual(path.tokenIds, want)
        do {
            _ = try await engine.complete(promptIds: ids, options: .init(maxTokens: 2, audio: [.bytes(Data("not audio".utf8))]))
            XCTFail("undecodable audio was accepted")
        } catch let e as WeftError {
            XCTAssertEqual(e.code, .invalidArgument)
            XCTAssertTrue(e.message.contains("audio[0]"), e.message)
        }
        XCTAssertFalse(try Shared.get().modelInfo.audio)
    }
}
