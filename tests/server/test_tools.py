"""Tool calling through the official `openai` and `anthropic` clients on the default model
(SmolLM2-135M-Instruct, whose template has no tool support: Weft's fallback prompt and the
`<tool_call>` syntax, docs/tools.md).

A full loop per protocol (call -> tool result -> text answer), streaming and not, with the
streamed deltas assembling to the non-streamed call at temperature 0; forced choices (named,
required / any: enforced by a grammar, arguments valid for the schema; parallel calls with
their stream indexes); and the 400s for bad
tool input.

    WEFT_URL=... WEFT_API_KEY=... WEFT_MODEL_ID=... .venv/bin/python tests/server/test_tools.py
"""
import json
import unittest

import anthropic
import openai

from wire import API_KEY, MODEL_ID, URL, SSEStream

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city"}},
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "description": "Get the local time in a city",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
GREEDY = {"temperature": 0}
MAX = 24
# A stop string the call's tail ('"}}' and the closing tag) is a prefix of: the engine holds the
# tail back until the grammar ends the row, so the last argument piece comes with its final
# event, which the server must still stream.
HOLD = '"}}\n</tool_call>!'


def oai():
    return openai.OpenAI(base_url=URL + "/v1", api_key=API_KEY or "none", max_retries=0, timeout=120)


def claude():
    return anthropic.Anthropic(base_url=URL, api_key=API_KEY or "none", max_retries=0, timeout=120)


def chat(**kw):
    return oai().chat.completions.create(model=MODEL_ID, temperature=0, **{"max_tokens": MAX, **kw})


def streamed_calls(chunks):
    """Assembles `delta.tool_calls` the way OpenAI's docs tell clients to; checks the shape of
    each call's first chunk. Returns (text, calls, finish_reason)."""
    text, calls, finish = "", {}, None
    for c in chunks:
        if not c.choices:
            continue
        choice = c.choices[0]
        text += choice.delta.content or ""
        for d in choice.delta.tool_calls or []:
            if d.index not in calls:
                assert d.id and d.type == "function" and d.function.name and d.function.arguments == "", d
                calls[d.index] = {"id": d.id, "name": d.function.name, "arguments": ""}
            else:
                assert d.id is None and d.function.name is None, d
                calls[d.index]["arguments"] += d.function.arguments
        finish = choice.finish_reason or finish
    return text, [calls[i] for i in sorted(calls)], finish


class OpenAITools(unittest.TestCase):
    def test_named_choice_loop_streaming_and_not(self):
        r = chat(messages=ASK, tools=[WEATHER, TIME], tool_choice=NAMED)
        choice = r.choices[0]
        self.assertEqual(choice.finish_reason, "tool_calls")
        self.assertIsNone(choice.message.content)
        (call,) = choice.message.tool_calls
        self.assertEqual((call.type, call.function.name), ("function", "get_weather"))
        self.assertTrue(call.id.startswith("call_"))
        args = json.loads(call.function.arguments)
        self.assertIsInstance(args["city"], str)  # required by the schema, enforced by the grammar

        # The same request streamed: the deltas assemble to the same call.
        text, calls, finish = streamed_calls(chat(messages=ASK, tools=[WEATHER, TIME], tool_choice=NAMED, stream=True))
        self.assertEqual((text, finish), ("", "tool_calls"))
        self.assertEqual([(c["name"], c["arguments"]) for c in calls], [("get_weather", call.function.arguments)])

        # The loop closes: the result goes back and the model answers in text.
        history = ASK + [
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump(exclude_none=True)]},
            {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"city": args["city"], "sky": "sunny", "celsius": 24})},
        ]
        r = chat(messages=history, tools=[WEATHER, TIME], tool_choice="none")
        self.assertIn(r.choices[0].finish_reason, ("stop", "length"))
        self.assertIsNone(r.choices[0].message.tool_calls)
        answer = r.choices[0].message.content
        self.assertTrue(answer.strip(), answer)
        streamed = chat(messages=history, tools=[WEATHER, TIME], tool_choice="none", stream=True)
        text, calls, finish = streamed_calls(streamed)
        self.assertEqual((text, calls, finish), (answer, [], r.choices[0].finish_reason))

    def test_arguments_completed_only_at_the_end_are_streamed(self):
        kw = dict(messages=ASK, tools=[WEATHER], tool_choice=NAMED, stop=[HOLD], max_tokens=40)
        r = chat(**kw)
        self.assertEqual(r.choices[0].finish_reason, "tool_calls")
        (call,) = r.choices[0].message.tool_calls
        self.assertIsInstance(json.loads(call.function.arguments)["city"], str)
        text, calls, finish = streamed_calls(chat(stream=True, **kw))
        self.assertEqual((text, finish), ("", "tool_calls"))
        self.assertEqual([c["arguments"] for c in calls], [call.function.arguments],
                         "the streamed deltas concatenate to the final arguments")

    def test_required_is_a_valid_call(self):
        # Enforced by the grammar: a call of one of the tools, arguments valid for its schema;
        # without parallel calls exactly one.
        r = chat(messages=ASK, tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False)
        self.assertEqual(r.choices[0].finish_reason, "tool_calls")
        self.assertIsNone(r.choices[0].message.content)
        (call,) = r.choices[0].message.tool_calls
        self.assertIn(call.function.name, ("get_weather", "get_time"))
        args = json.loads(call.function.arguments)
        if call.function.name == "get_weather":
            self.assertIsInstance(args["city"], str)

    def test_required_parallel_calls_stream_with_their_indexes(self):
        # parallel_tool_calls (the default): one or more calls, each valid; the streamed deltas
        # carry each call's index and assemble to the non-streamed calls.
        kw = dict(messages=ASK, tools=[WEATHER, TIME], tool_choice="required", max_tokens=80)
        r = chat(**kw)
        calls = r.choices[0].message.tool_calls or []
        self.assertGreaterEqual(len(calls), 1)
        complete = r.choices[0].finish_reason == "tool_calls"
        for c in calls if complete else calls[:-1]:
            self.assertIn(c.function.name, ("get_weather", "get_time"))
            self.assertIsInstance(json.loads(c.function.arguments), dict)
        text, streamed, finish = streamed_calls(chat(stream=True, **kw))
        self.assertEqual((text, finish), ("", r.choices[0].finish_reason))
        self.assertEqual([(c["name"], c["arguments"]) for c in streamed],
                         [(c.function.name, c.function.arguments) for c in calls])

    def test_auto_streams_what_it_returns(self):
        # Whatever the model chooses, streaming and not agree and no call text leaks.
        r = chat(messages=ASK, tools=[WEATHER])
        text, calls, finish = streamed_calls(chat(messages=ASK, tools=[WEATHER], stream=True))
        m = r.choices[0].message
        self.assertEqual(text, m.content or "")
        self.assertEqual([(c["name"], c["arguments"]) for c in calls],
                         [(c.function.name, c.function.arguments) for c in m.tool_calls or []])
        self.assertEqual(finish, r.choices[0].finish_reason)
        self.assertNotIn("<tool_call>", text)

    def test_bad_tool_input_is_a_400_naming_the_field(self):
        cases = [
            (dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice", "nope"),
            (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": 7}}}}}]),
             "tools[0]", "properties.a.type"),
            (dict(tools=[{"type": "function"}]), "tools[0]", "function"),
            (dict(tool_choice="required"), "tool_choice", "at least one tool"),
        ]
        for kw, param, words in cases:
            with self.assertRaises(openai.BadRequestError) as e:
                chat(messages=ASK, **kw)
            self.assertEqual(e.exception.body.get("param"), param, e.exception.body)
            self.assertIn(words, e.exception.body["message"])
        stray = ASK + [{"role": "tool", "tool_call_id": "call_x", "content": "1"}]
        with self.assertRaises(openai.BadRequestError) as e:
            chat(messages=stray, tools=[WEATHER])
        self.assertEqual(e.exception.body.get("param"), "messages[1].tool_call_id")


class AnthropicTools(unittest.TestCase):
    TOOLS = [{"name": "get_weather", "description": "Get the current weather in a city",
              "input_schema": WEATHER["function"]["parameters"]}]

    def create(self, **kw):
        return claude().messages.create(model=MODEL_ID, max_tokens=MAX, tools=self.TOOLS, extra_body=GREEDY, **kw)

    def test_tool_use_loop_streaming_and_not(self):
        m = self.create(messages=ASK, tool_choice={"type": "tool", "name": "get_weather"})
        self.assertEqual(m.stop_reason, "tool_use")
        uses = [b for b in m.content if b.type == "tool_use"]
        self.assertEqual(len(uses), 1)
        self.assertEqual(uses[0].name, "get_weather")
        self.assertIsInstance(uses[0].input["city"], str)

        # Streamed: content_block_start (tool_use) + input_json_delta assemble to the same input.
        with claude().messages.stream(model=MODEL_ID, max_tokens=MAX, tools=self.TOOLS, messages=ASK, extra_body=GREEDY,
                                      tool_choice={"type": "tool", "name": "get_weather"}) as s:
            events = list(s)
            final = s.get_final_message()
        starts = [e for e in events if e.type == "content_block_start" and e.content_block.type == "tool_use"]
        self.assertEqual(len(starts), 1)
        partial = "".join(e.delta.partial_json for e in events
                          if e.type == "content_block_delta" and e.delta.type == "input_json_delta")
        self.assertEqual(json.loads(partial), uses[0].input)
        self.assertEqual([(b.name, b.input) for b in final.content if b.type == "tool_use"], [("get_weather", uses[0].input)])
        self.assertEqual(final.stop_reason, "tool_use")

        history = ASK + [
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "sunny, 24 C"}]},
        ]
        answer = self.create(messages=history, tool_choice={"type": "none"})
        self.assertIn(answer.stop_reason, ("end_turn", "max_tokens"))
        self.assertEqual([b.type for b in answer.content], ["text"])
        self.assertTrue(answer.content[0].text.strip())

    def test_arguments_completed_only_at_the_end_are_streamed(self):
        choice = {"type": "tool", "name": "get_weather"}
        kw = dict(model=MODEL_ID, max_tokens=40, tools=self.TOOLS, messages=ASK, extra_body=GREEDY,
                  tool_choice=choice, stop_sequences=[HOLD])
        m = claude().messages.create(**kw)
        self.assertEqual(m.stop_reason, "tool_use")
        (use,) = [b for b in m.content if b.type == "tool_use"]
        with claude().messages.stream(**kw) as s:
            events = list(s)
            final = s.get_final_message()
        partial = "".join(e.delta.partial_json for e in events
                          if e.type == "content_block_delta" and e.delta.type == "input_json_delta")
        self.assertEqual(json.loads(partial), use.input, "the input_json_deltas concatenate to the final input")
        self.assertEqual(final.stop_reason, "tool_use")

    def test_any_is_a_valid_call(self):
        m = self.create(messages=ASK, tool_choice={"type": "any", "disable_parallel_tool_use": True})
        self.assertEqual(m.stop_reason, "tool_use")
        self.assertEqual([(b.type, b.name) for b in m.content], [("tool_use", "get_weather")])
        self.assertIsInstance(m.content[0].input["city"], str)

    def test_bad_tool_input_is_a_400_naming_the_field(self):
        with self.assertRaises(anthropic.BadRequestError) as e:
            self.create(messages=ASK, tool_choice={"type": "tool", "name": "nope"})
        self.assertIn("nope", e.exception.body["error"]["message"])
        with self.assertRaises(anthropic.BadRequestError) as e:
            claude().messages.create(model=MODEL_ID, max_tokens=8, messages=ASK, tools=[{"name": "f"}])
        self.assertIn("input_schema", e.exception.body["error"]["message"])
        stray = ASK + [{"role": "assistant", "content": "ok"},
                       {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "1"}]}]
        with self.assertRaises(anthropic.BadRequestError) as e:
            self.create(messages=stray)
        self.assertIn("toolu_x", e.exception.body["error"]["message"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
