"""What agent clients rely on, through the official clients on the tiny goldens GGUF (random
weights, a small byte-level tokenizer and chat template; context 2048): the Responses API
(`responses.create` streaming and not, the SDK's stream helper, previous_response_id, the
store and its input_items, function tools with hosted tools left out, text.format json_schema, reasoning items in
the input), Chat Completions `n` > 1 (streaming and not), Anthropic Messages as Claude Code
sends them (system-role messages, `?beta=true`, beta headers, cache_control, thinking), exact
count_tokens with tools, context overflow in each protocol's words, context lengths in
/v1/models.

A random model's answers mean nothing, so each check compares the server with itself (the
Responses answer with the chat answer of the same conversation, streamed with not streamed).

    WEFT_URL=... WEFT_API_KEY=... WEFT_MODEL_ID=tiny .venv/bin/python tests/server/test_agents.py
"""
import json
import re
import unittest

import anthropic
import openai

from wire import API_KEY, MODEL_ID, URL, SSEStream, request

GREEDY = {"ignore_eos": True}
SEA = "Tell me about the sea."
# The city is an enum: a random model's forced call then always completes within a few tokens.
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                          "required": ["city"], "additionalProperties": False}}
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["ok"], "properties": {"ok": {"type": "boolean"}}}


def oai():
    return openai.OpenAI(base_url=URL + "/v1", api_key=API_KEY or "none", max_retries=0, timeout=120)


def claude():
    return anthropic.Anthropic(base_url=URL, api_key=API_KEY or "none", max_retries=0, timeout=120)


def chat(messages, max_tokens=12, extra=None, **kw):
    return oai().chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=max_tokens, temperature=0,
                                         extra_body={**GREEDY, **(extra or {})}, **kw)


def respond(extra=None, **kw):
    kw.setdefault("max_output_tokens", 12)
    return oai().responses.create(model=MODEL_ID, temperature=0, extra_body={**GREEDY, **(extra or {})}, **kw)


class Responses(unittest.TestCase):
    def test_text_answer_equals_chat(self):
        r = respond(input=SEA, instructions="Be brief.")
        c = chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": SEA}])
        self.assertEqual(r.output_text, c.choices[0].message.content)
        self.assertEqual((r.status, r.incomplete_details.reason), ("incomplete", "max_output_tokens"))
        self.assertEqual(r.usage.input_tokens, c.usage.prompt_tokens)
        self.assertEqual(r.usage.output_tokens, 12)
        self.assertEqual(r.usage.total_tokens, r.usage.input_tokens + 12)
        self.assertEqual(r.usage.output_tokens_details.reasoning_tokens, 0)
        self.assertEqual([o.type for o in r.output], ["message"])
        self.assertEqual(r.model, MODEL_ID)
        self.assertEqual(r.instructions, "Be brief.")

    def test_streaming_equals_not_streaming(self):
        r = respond(input=SEA)
        events = list(respond(input=SEA, stream=True))
        types = [e.type for e in events]
        self.assertEqual(types[:4], ["response.created", "response.in_progress", "response.output_item.added",
                                     "response.content_part.added"])
        self.assertEqual(types[-4:], ["response.output_text.done", "response.content_part.done",
                                      "response.output_item.done", "response.incomplete"])
        self.assertEqual([e.sequence_number for e in events], list(range(len(events))))
        deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        self.assertEqual(deltas, r.output_text)
        final = events[-1].response
        self.assertEqual(final.output_text, r.output_text)
        self.assertEqual(final.usage.output_tokens, r.usage.output_tokens)
        # The SDK's stream helper assembles (and checks) the same response; it wants a completed
        # one (a length cut ends with `response.incomplete`, as OpenAI's): a schema-bound answer.
        fmt = {"format": {"type": "json_schema", "name": "x", "schema": SCHEMA, "strict": True}}
        done = oai().responses.create(model=MODEL_ID, input=SEA, max_output_tokens=40, temperature=0, text=fmt)
        with oai().responses.stream(model=MODEL_ID, input=SEA, max_output_tokens=40, temperature=0, text=fmt) as s:
            for _ in s:
                pass
            final = s.get_final_response()
        self.assertEqual((final.status, final.output_text), ("completed", done.output_text))

    def test_previous_response_and_the_store(self):
        first = respond(input=SEA, instructions="Be brief.")
        second = respond(input="And the sky?", previous_response_id=first.id, instructions="Be brief.")
        c = chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": SEA},
                  {"role": "assistant", "content": first.output_text}, {"role": "user", "content": "And the sky?"}])
        self.assertEqual(second.output_text, c.choices[0].message.content)
        self.assertEqual(second.usage.input_tokens, c.usage.prompt_tokens)
        got = oai().responses.retrieve(first.id)
        self.assertEqual((got.id, got.output_text), (first.id, first.output_text))
        oai().responses.delete(first.id)
        with self.assertRaises(openai.NotFoundError):
            oai().responses.retrieve(first.id)
        with self.assertRaises(openai.BadRequestError) as e:
            respond(input="x", previous_response_id=first.id)
        self.assertIn("not found", str(e.exception))
        unstored = respond(input=SEA, store=False)
        with self.assertRaises(openai.NotFoundError):
            oai().responses.retrieve(unstored.id)

    def test_input_items_list_the_request_input(self):
        first = respond(input=SEA)
        items = list(oai().responses.input_items.list(first.id))
        self.assertEqual(len(items), 1)
        self.assertEqual((items[0].type, items[0].role, items[0].content[0].text), ("message", "user", SEA))
        given = [{"role": "user", "content": "One."}, {"role": "assistant", "content": "Two."},
                 {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Three."}]}]
        r = respond(input=given)
        newest_first = oai().responses.input_items.list(r.id)
        texts = [i.content[0].text if isinstance(i.content, list) else i.content for i in newest_first.data]
        self.assertEqual(texts, ["Three.", "Two.", "One."])
        page = oai().responses.input_items.list(r.id, order="asc", limit=2)
        self.assertEqual(([i.id for i in page.data], page.has_more), ([newest_first.data[2].id, newest_first.data[1].id], True))
        rest = oai().responses.input_items.list(r.id, order="asc", after=page.last_id)
        self.assertEqual(([i.id for i in rest.data], rest.has_more), ([newest_first.data[0].id], False))
        with self.assertRaises(openai.BadRequestError) as e:
            oai().responses.input_items.list(r.id, limit=0)
        self.assertIn("limit", str(e.exception))
        with self.assertRaises(openai.NotFoundError):
            oai().responses.input_items.list("resp_missing")

    def test_function_call_loop(self):
        tools = [WEATHER, {"type": "web_search"}]
        choice = {"type": "function", "name": "get_weather"}
        r = respond(input="Weather in Paris?", tools=tools, tool_choice=choice, max_output_tokens=40)
        calls = [o for o in r.output if o.type == "function_call"]
        self.assertEqual(len(calls), 1, r.output)
        self.assertEqual(calls[0].name, "get_weather")
        self.assertIsInstance(json.loads(calls[0].arguments)["city"], str)
        self.assertEqual(r.status, "completed")
        # Streamed: the argument deltas assemble to the same call.
        events = list(respond(input="Weather in Paris?", tools=tools, tool_choice=choice, max_output_tokens=40,
                              stream=True))
        args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
        done = [e for e in events if e.type == "response.function_call_arguments.done"]
        self.assertEqual((args, done[0].arguments), (calls[0].arguments, calls[0].arguments))
        # The result goes back as an input item, after the call (as a stateless client sends it).
        items = [{"role": "user", "content": "Weather in Paris?"},
                 {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather",
                  "arguments": calls[0].arguments},
                 {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"}]
        answer = respond(input=items, tools=tools, tool_choice="none", store=False)
        self.assertEqual([o.type for o in answer.output], ["message"])
        # ... or after previous_response_id (as Codex sends it).
        chained = respond(previous_response_id=r.id, tools=tools, tool_choice="none",
                          input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"}])
        self.assertEqual(chained.output_text, answer.output_text)

    def test_json_schema_text_format(self):
        r = oai().responses.create(model=MODEL_ID, input=SEA, max_output_tokens=40, temperature=0,
                                   text={"format": {"type": "json_schema", "name": "x", "schema": SCHEMA, "strict": True}})
        self.assertIsInstance(json.loads(r.output_text)["ok"], bool)
        self.assertEqual(r.status, "completed")
        with self.assertRaises(openai.BadRequestError) as e:
            respond(input=SEA, text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "nonsense"}}})
        self.assertEqual(e.exception.body["param"], "text.format")

    def test_items_reasoning_and_efforts(self):
        items = [{"type": "message", "role": "developer", "content": "Be brief."},
                 {"type": "message", "role": "user", "content": [{"type": "input_text", "text": SEA}]},
                 {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Think."}]},
                 {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Waves."}]},
                 {"role": "user", "content": "More."}]
        for effort in ("low", "medium", "high", "none"):
            r = respond(input=items, reasoning={"effort": effort, "summary": "auto"}, include=["reasoning.encrypted_content"],
                        metadata={"a": "b"}, parallel_tool_calls=False,
                        extra={"prompt_cache_key": "k", "client_metadata": {"x": 1}})
            self.assertEqual(r.output[-1].type, "message")
        with self.assertRaises(openai.BadRequestError) as e:
            respond(input=SEA, reasoning={"effort": "enormous"})
        self.assertEqual(e.exception.body["param"], "reasoning.effort")


class Chat(unittest.TestCase):
    def test_n_choices(self):
        r = chat([{"role": "user", "content": SEA}], n=3)
        self.assertEqual([c.index for c in r.choices], [0, 1, 2])
        self.assertEqual(len({c.message.content for c in r.choices}), 1, "greedy choices are equal")
        self.assertEqual(r.usage.completion_tokens, 36)
        one = chat([{"role": "user", "content": SEA}])
        self.assertEqual(r.usage.prompt_tokens, one.usage.prompt_tokens)
        stream = chat([{"role": "user", "content": SEA}], n=2, stream=True, stream_options={"include_usage": True})
        texts, finishes, usage = {0: "", 1: ""}, {}, None
        for chunk in stream:
            if not chunk.choices:
                usage = chunk.usage
            for c in chunk.choices:
                texts[c.index] += c.delta.content or ""
                if c.finish_reason:
                    finishes[c.index] = c.finish_reason
        self.assertEqual(texts, {0: one.choices[0].message.content, 1: one.choices[0].message.content})
        self.assertEqual(finishes, {0: "length", 1: "length"})
        self.assertEqual(usage.completion_tokens, 24)
        with self.assertRaises(openai.BadRequestError):
            chat([{"role": "user", "content": SEA}], n=0)

    def test_parallel_tool_calls_false_is_one_call(self):
        tool = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
        for parallel, most in ((False, 1), (True, None)):
            r = chat([{"role": "user", "content": "Weather in Paris and Rome?"}], max_tokens=120, tools=[tool],
                     tool_choice="required", parallel_tool_calls=parallel)
            calls = r.choices[0].message.tool_calls or []
            self.assertGreaterEqual(len(calls), 1)
            if most is not None:
                self.assertEqual((len(calls), r.choices[0].finish_reason), (most, "tool_calls"))

    def test_template_and_reasoning_fields(self):
        r = chat([{"role": "user", "content": SEA},
                  {"role": "assistant", "content": "Waves.", "reasoning_content": "The sea has waves."},
                  {"role": "user", "content": "More."}],
                 reasoning_effort="low", extra={"chat_template_kwargs": {"enable_thinking": False},
                                                "reasoning_budget": 64})
        self.assertEqual(r.usage.completion_tokens_details.reasoning_tokens, 0)
        with self.assertRaises(openai.BadRequestError) as e:
            chat([{"role": "user", "content": SEA}], extra={"chat_template_kwargs": [1]})
        self.assertEqual(e.exception.body["param"], "chat_template_kwargs")


class ClaudeCode(unittest.TestCase):
    BODY = {"model": MODEL_ID, "max_tokens": 8, "temperature": 0, "ignore_eos": True}

    def test_system_messages_betas_and_cache_control(self):
        cc = {"type": "ephemeral"}
        body = {**self.BODY, "system": [{"type": "text", "text": "You are terse.", "cache_control": cc}],
                "messages": [{"role": "system", "content": "Answer in English."},
                             {"role": "user", "content": [{"type": "text", "text": SEA, "cache_control": cc}]}],
                "metadata": {"user_id": "u"}, "context_management": {"edits": []},
                "thinking": {"type": "enabled", "budget_tokens": 1024},
                "tools": [{"name": "get_weather", "description": "w", "cache_control": cc,
                           "input_schema": WEATHER["parameters"]},
                          {"type": "web_search_20250305", "name": "web_search", "max_uses": 2}]}
        headers = {"x-api-key": API_KEY, "anthropic-version": "2023-06-01",
                   "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14"}
        st, _, m = request("POST", "/v1/messages?beta=true", body, headers=headers)
        self.assertEqual(st, 200, m)
        # The same as one system prompt with both texts.
        merged = {**body, "system": "You are terse.\n\nAnswer in English.", "messages": body["messages"][1:]}
        st, _, m2 = request("POST", "/v1/messages", merged, headers=headers)
        # The prompt cache (on by default) serves the repeat: Anthropic's input_tokens counts
        # only what was not read from it.
        prompt = lambda u: u["input_tokens"] + (u.get("cache_read_input_tokens") or 0)  # noqa: E731
        self.assertEqual((st, m2["content"], prompt(m2["usage"]), m2["usage"]["output_tokens"]),
                         (200, m["content"], prompt(m["usage"]), m["usage"]["output_tokens"]))
        # count_tokens counts exactly that prompt, tools included.
        count = dict(body)
        del count["max_tokens"]
        st, _, n = request("POST", "/v1/messages/count_tokens?beta=true", count, headers=headers)
        self.assertEqual((st, n["input_tokens"]), (200, prompt(m["usage"])))
        without_tools = {k: v for k, v in count.items() if k != "tools"}
        st, _, fewer = request("POST", "/v1/messages/count_tokens", without_tools, headers=headers)
        self.assertLess(fewer["input_tokens"], n["input_tokens"])

    def test_history_blocks(self):
        history = [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Use the tool.", "signature": "abc"},
                {"type": "redacted_thinking", "data": "xyz"},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "cache_control": {"type": "ephemeral"},
                 "content": [{"type": "text", "text": "sunny"}]},
                {"type": "text", "text": "Thanks."}]},
        ]
        m = claude().messages.create(model=MODEL_ID, max_tokens=8, messages=history,
                                     tools=[{"name": "get_weather", "input_schema": WEATHER["parameters"]}],
                                     thinking={"type": "disabled"})
        self.assertEqual(m.content[0].type, "text")
        n = claude().messages.count_tokens(model=MODEL_ID, messages=history,
                                           tools=[{"name": "get_weather", "input_schema": WEATHER["parameters"]}])
        # input_tokens leaves out what the prompt cache (on by default) served.
        self.assertEqual(n.input_tokens, m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0))


class Limits(unittest.TestCase):
    LONG = [{"role": "user", "content": "hello " * 2100}]

    def test_overflow_in_each_protocols_words(self):
        with self.assertRaises(anthropic.BadRequestError) as e:
            claude().messages.create(model=MODEL_ID, max_tokens=8, messages=self.LONG)
        msg = e.exception.body["error"]["message"]
        found = re.match(r"prompt is too long: (\d+) tokens > (\d+) maximum", msg)
        self.assertIsNotNone(found, msg)
        self.assertEqual(int(found.group(2)), 2047)
        counted = claude().messages.count_tokens(model=MODEL_ID, messages=self.LONG).input_tokens
        self.assertEqual(int(found.group(1)), counted)
        with self.assertRaises(openai.BadRequestError) as e:
            chat(self.LONG)
        self.assertEqual(e.exception.code, "context_length_exceeded")
        self.assertIn("context", e.exception.body["message"])

    def test_models_give_the_context_length(self):
        m = oai().models.retrieve(MODEL_ID)
        self.assertEqual((m.context_length, m.max_model_len), (2048, 2048))
        page = claude().models.list()
        self.assertEqual([x.id for x in page.data], [MODEL_ID])
        self.assertEqual(page.data[0].type, "model")


if __name__ == "__main__":
    unittest.main(verbosity=2)
