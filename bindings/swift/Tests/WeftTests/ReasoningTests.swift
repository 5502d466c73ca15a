import Foundation
import XCTest
@testable import Weft

/// A reasoning model: a tiny Qwen3.5 with the real Qwen3 vocabulary and Qwen3.5 template, written
/// by scripts/swift-test (scripts/make-qwen35-chat-model) and named by WEFT_TEST_QWEN35_MODEL. The
/// template leaves the model in its <think> block, so a random model's output is reasoning until
/// a budget closes the block; `Chunk.reasoning` carries it apart from `text`.
final class ReasoningTests: XCTestCase {
    let messages: [Message] = [.user("Why is the sky blue?")]

    func testReasoningStreamsApartABudgetClosesItAndThinkingTurnsOff() async throws {
        guard let model = ProcessInfo.processInfo.environment["WEFT_TEST_QWEN35_MODEL"] else {
            throw XCTSkip("WEFT_TEST_QWEN35_MODEL is not set (scripts/swift-test sets it)")
        }
        let engine = try Engine(options: .init(model: model))
        let budgeted = GenerateOptions(maxTokens: 12, reasoningBudget: 3)
        var reasoning = ""
        var text = ""
        var answerBeforeReasoningEnded = false
        for try await chunk in engine.generate(messages: messages, options: budgeted) {
            if !chunk.reasoning.isEmpty && !text.isEmpty { answerBeforeReasoningEnded = true }
            reasoning += chunk.reasoning
            text += chunk.text
        }
        XCTAssertFalse(reasoning.isEmpty, "reasoning streamed")
        XCTAssertFalse(answerBeforeReasoningEnded, "reasoning first, then the answer")

        let done = try await engine.complete(messages: messages, options: budgeted)
        XCTAssertEqual(done.reasoning, reasoning)
        XCTAssertEqual(done.text, text)
        XCTAssertTrue(done.usage.reasoningTokens > 3 && done.usage.reasoningTokens < 12, "\(done.usage.reasoningTokens)")

        let open = try await engine.complete(messages: messages, options: GenerateOptions(maxTokens: 6))
        XCTAssertEqual(open.text, "", "an unfinished block is all reasoning")
        XCTAssertEqual(open.usage.reasoningTokens, 6)

        let off = try await engine.complete(
            messages: messages, options: GenerateOptions(maxTokens: 4, chatTemplateKwargs: #"{"enable_thinking": false}"#))
        XCTAssertEqual(off.reasoning, "")
        XCTAssertEqual(off.usage.reasoningTokens, 0)
    }
}
