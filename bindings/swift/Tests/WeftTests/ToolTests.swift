import Foundation
import XCTest
@testable import Weft

/// Tool calls on the tiny GGUF model (random weights, a ChatML template without tools: Weft's
/// fallback prompt). The choice is forced and the one parameter is an enum, so the output is a
/// complete call whatever the weights are.
final class ToolTests: XCTestCase {
    let weather = Tool(
        name: "get_weather",
        description: "Weather in a unit",
        parameters: #"{"type": "object", "properties": {"unit": {"enum": ["c", "f"]}}, "required": ["unit"], "additionalProperties": false}"#
    )

    /// The stop string holds back the call's tail ('"}}' and the closing tag are a prefix of it)
    /// until the grammar ends the row: the engine's final event releases the last argument
    /// piece, and the stream still delivers it.
    func testArgumentsCompletedOnlyAtTheEndAreStreamed() async throws {
        let path = repoRoot.appendingPathComponent("goldens/gguf/llama-q4_1.gguf").path
        let engine = try Engine(options: .init(model: path))
        let options = GenerateOptions(maxTokens: 40, stop: ["\"}}\n</tool_call>!"], tools: [weather], toolChoice: .function("get_weather"))
        let generation = engine.generate(messages: [.user("What is the weather in Oslo?")], options: options)
        var streamed = ""
        for try await chunk in generation {
            for delta in chunk.toolCalls {
                if case let .arguments(_, fragment) = delta {
                    streamed += fragment
                }
            }
        }
        let done = try await generation.completion()
        XCTAssertEqual(done.finishReason, .toolCalls)
        let call = try XCTUnwrap(done.toolCalls.first)
        XCTAssertEqual(streamed, call.arguments, "the streamed fragments concatenate to the final arguments")
    }

    func testRequiredCallStreamsDeltasThatAssembleToTheCompletion() async throws {
        let path = repoRoot.appendingPathComponent("goldens/gguf/llama-q4_1.gguf").path
        let engine = try Engine(options: .init(model: path))
        let options = GenerateOptions(maxTokens: 40, tools: [weather], toolChoice: .required, parallelToolCalls: false)
        let generation = engine.generate(messages: [.user("What is the weather in Oslo?")], options: options)
        var text = ""
        var assembled: [(id: String, name: String, arguments: String)] = []
        for try await chunk in generation {
            text += chunk.text
            for delta in chunk.toolCalls {
                switch delta {
                case let .start(index, id, name):
                    XCTAssertEqual(index, assembled.count)
                    assembled.append((id, name, ""))
                case let .arguments(index, fragment):
                    assembled[index].arguments += fragment
                }
            }
        }
        let done = try await generation.completion()
        XCTAssertEqual(done.finishReason, .toolCalls)
        XCTAssertEqual(text, "", "a call's text is not streamed as text")
        XCTAssertEqual(done.toolCalls.count, 1)
        let call = try XCTUnwrap(done.toolCalls.first)
        XCTAssertEqual(call.name, "get_weather")
        XCTAssertTrue(call.id.hasPrefix("call_"), call.id)
        let args = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(call.arguments.utf8)) as? [String: String], call.arguments)
        XCTAssertTrue(["c", "f"].contains(args["unit"] ?? ""), call.arguments)
        XCTAssertEqual(assembled.map { ToolCall(id: $0.id, name: $0.name, arguments: $0.arguments) }, done.toolCalls)

        // The call goes back into the history with its result.
        let followUp = try await engine.complete(
            messages: [.user("What is the weather in Oslo?"), .assistant(toolCalls: done.toolCalls), .tool("rain", callId: call.id)],
            options: .init(maxTokens: 4, tools: [weather])
        )
        XCTAssertTrue([FinishReason.stop, .length, .toolCalls].contains(followUp.finishReason))

        do {
            _ = try await engine.complete(messages: [.user("q")], options: .init(tools: [weather], toolChoice: .function("nosuch")))
            XCTFail("an unknown tool in toolChoice was accepted")
        } catch let e as WeftError {
            XCTAssertEqual(e.code, .invalidArgument)
            XCTAssertTrue(e.message.contains("toolChoice"), e.message)
        }
    }
}
