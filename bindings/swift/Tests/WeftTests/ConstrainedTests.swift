import Foundation
import XCTest
@testable import Weft

/// Constrained output on the tiny GGUF model with an embedded tokenizer (random weights: the
/// output is valid only because the constraint works); a bad schema throws at submit.
final class ConstrainedTests: XCTestCase {
    func testSchemaRegexChoiceAndBadSchema() async throws {
        let path = repoRoot.appendingPathComponent("goldens/gguf/llama-q4_1.gguf").path
        let engine = try Engine(options: .init(model: path))
        let schema = #"{"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["n"], "additionalProperties": false}"#
        let json = try await engine.complete(prompt: "The sea", options: .init(maxTokens: 40, constraint: .jsonSchema(schema)))
        XCTAssertEqual(json.finishReason, .stop)
        let value = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(json.text.utf8)) as? [String: Int], json.text)
        XCTAssertEqual(Array(value.keys), ["n"])
        XCTAssertTrue((0...99).contains(value["n"]!), json.text)
        let rx = try await engine.complete(prompt: "The sea", options: .init(maxTokens: 20, constraint: .regex("[0-9]{3}")))
        XCTAssertNotNil(rx.text.range(of: "^[0-9]{3}$", options: .regularExpression), rx.text)
        let pick = try await engine.complete(prompt: "The sea", options: .init(maxTokens: 20, constraint: .choice(["calm", "rough"])))
        XCTAssertTrue(["calm", "rough"].contains(pick.text), pick.text)
        do {
            _ = try await engine.complete(prompt: "a", options: .init(constraint: .jsonSchema(#"{"type": "nosuch"}"#)))
            XCTFail("a bad schema was accepted")
        } catch let e as WeftError {
            XCTAssertEqual(e.code, .invalidArgument)
            XCTAssertTrue(e.message.contains("json_schema"), e.message)
        }
    }
}
