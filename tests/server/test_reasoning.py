"""A reasoning model through the official clients: a tiny Qwen3.5 with the real Qwen3
vocabulary and the real Qwen3.5 template (random weights; tests/support builds it). With
thinking on the template leaves the model in its <think> block, so unfinished reasoning must
arrive as `reasoning_content` / `thinking` and never as content; thinking off renders the
template's closed block; a forced call comes in the model's own format after a budgeted block
(Qwen3-Coder XML, parsed back to JSON arguments); Anthropic answers `thinking` then `tool_use`;
Responses gives a reasoning item before the function call. With WEFT_MODEL_ID=gemma4, a tiny
Gemma 4 text model with the real Gemma 4 template instead: calls in Gemma 4's own syntax on
every endpoint, thinking on and off rendered by the template.

    WEFT_URL=... WEFT_API_KEY=... WEFT_MODEL_ID=qwen35 .venv/bin/python tests/server/test_reasoning.py
"""
import json
import unittest

import anthropic
import openai

from wire import API_KEY, MODEL_ID, URL

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
FORECAST = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]},
                                             "metric": {"type": "boolean"}},
            "required": ["city", "metric"], "additionalProperties": False}
CHAT_TOOL = {"type": "function", "function": {"name": "get_forecast", "parameters": FORECAST}}
NAMED = {"type": "function", "function": {"name": "get_forecast"}}
THINKING_OFF = {"chat_template_kwargs": {"enable_thinking": False}}


def oai():
    return openai.OpenAI(base_url=URL + "/v1", api_key=API_KEY or "none", max_retries=0, timeout=120)


def claude():
    return anthropic.Anthropic(base_url=URL, api_key=API_KEY or "none", max_retries=0, timeout=120)


def valid_forecast(arguments):
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    return set(args) == {"city", "metric"} and args["city"] in ("Paris", "Oslo") and isinstance(args["metric"], bool)


QWEN = unittest.skipUnless(MODEL_ID == "qwen35", "the Qwen3.5 model's checks")
GEMMA = unittest.skipUnless(MODEL_ID == "gemma4", "the Gemma 4 model's checks")


@QWEN
class ChatCompletions(unittest.TestCase):
    def test_unfinished_reasoning_is_reasoning_content(self):
        r = oai().chat.completions.create(model=MODEL_ID, messages=ASK, max_tokens=10, temperature=0)
        m = r.choices[0].message
        self.assertFalse(m.content, "no reasoning leaks into content")
        self.assertTrue(m.model_extra.get("reasoning_content"), r)
        self.assertEqual(r.usage.completion_tokens_details.reasoning_tokens, 10)
        self.assertEqual(r.choices[0].finish_reason, "length")

    def test_streamed_deltas_split_the_same_way(self):
        stream = oai().chat.completions.create(model=MODEL_ID, messages=ASK, max_tokens=10, temperature=0, stream=True)
        content, reasoning = "", ""
        for chunk in stream:
            for c in chunk.choices:
                content += c.delta.content or ""
                reasoning += (c.delta.model_extra or {}).get("reasoning_content") or ""
        self.assertEqual(content, "")
        full = oai().chat.completions.create(model=MODEL_ID, messages=ASK, max_tokens=10, temperature=0)
        self.assertEqual(reasoning, full.choices[0].message.model_extra["reasoning_content"])

    def test_thinking_off_has_no_reasoning(self):
        r = oai().chat.completions.create(model=MODEL_ID, messages=ASK, max_tokens=6, temperature=0, extra_body=THINKING_OFF)
        self.assertFalse(r.choices[0].message.model_extra.get("reasoning_content"))
        on = oai().chat.completions.create(model=MODEL_ID, messages=ASK, max_tokens=1, temperature=0)
        # The closed empty block (`<think>\n\n</think>\n\n`) is in the thinking-off prompt.
        self.assertGreater(r.usage.prompt_tokens, on.usage.prompt_tokens)

    def test_named_call_after_a_budgeted_block(self):
        r = oai().chat.completions.create(model=MODEL_ID, messages=ASK, max_tokens=80, temperature=0,
                                          tools=[CHAT_TOOL], tool_choice=NAMED, extra_body={"reasoning_budget": 3})
        c = r.choices[0]
        self.assertEqual(c.finish_reason, "tool_calls", r)
        self.assertTrue(c.message.model_extra.get("reasoning_content"))
        self.assertEqual(len(c.message.tool_calls), 1)
        self.assertEqual(c.message.tool_calls[0].function.name, "get_forecast")
        self.assertTrue(valid_forecast(c.message.tool_calls[0].function.arguments), c.message.tool_calls[0])
        self.assertFalse((c.message.content or "").strip())

    def test_a_call_cut_by_max_tokens_is_not_delivered(self):
        r = oai().chat.completions.create(model=MODEL_ID, messages=ASK, max_tokens=3, temperature=0,
                                          tools=[CHAT_TOOL], tool_choice="required", extra_body=THINKING_OFF)
        self.assertEqual(r.choices[0].finish_reason, "length")
        self.assertFalse(r.choices[0].message.tool_calls)


@QWEN
class Messages(unittest.TestCase):
    def test_thinking_then_tool_use(self):
        tool = {"name": "get_forecast", "input_schema": FORECAST}
        r = claude().messages.create(model=MODEL_ID, max_tokens=1100, messages=ASK, tools=[tool],
                                     tool_choice={"type": "tool", "name": "get_forecast"},
                                     thinking={"type": "enabled", "budget_tokens": 1024})
        kinds = [b.type for b in r.content]
        self.assertEqual(kinds[0], "thinking", kinds)
        self.assertEqual(kinds[-1], "tool_use", kinds)
        self.assertTrue(r.content[0].thinking)
        self.assertTrue(valid_forecast(r.content[-1].input), r.content[-1])
        self.assertEqual(r.stop_reason, "tool_use")

    def test_streamed_thinking_deltas(self):
        thinking, text = "", ""
        with claude().messages.stream(model=MODEL_ID, max_tokens=8, messages=ASK,
                                      thinking={"type": "enabled", "budget_tokens": 1024}) as s:
            for ev in s:
                if ev.type == "content_block_delta" and ev.delta.type == "thinking_delta":
                    thinking += ev.delta.thinking
                elif ev.type == "content_block_delta" and ev.delta.type == "text_delta":
                    text += ev.delta.text
        self.assertTrue(thinking)
        self.assertEqual(text, "")

    def test_thinking_disabled(self):
        r = claude().messages.create(model=MODEL_ID, max_tokens=6, messages=ASK, thinking={"type": "disabled"})
        self.assertNotIn("thinking", [b.type for b in r.content])


@QWEN
class Responses(unittest.TestCase):
    def test_reasoning_item_then_function_call(self):
        tool = {"type": "function", "name": "get_forecast", "parameters": FORECAST}
        r = oai().responses.create(model=MODEL_ID, input="What is the weather in Paris?", tools=[tool],
                                   tool_choice={"type": "function", "name": "get_forecast"},
                                   reasoning={"effort": "minimal"}, max_output_tokens=400)
        kinds = [item.type for item in r.output]
        self.assertEqual(kinds[0], "reasoning", kinds)
        self.assertEqual(kinds[-1], "function_call", kinds)
        self.assertTrue(valid_forecast(r.output[-1].arguments), r.output[-1])
        self.assertGreater(r.usage.output_tokens_details.reasoning_tokens, 0)


@GEMMA
class Gemma4(unittest.TestCase):
    """Gemma 4's calls (`<|tool_call>call:get_forecast{city:<|"|>Paris<|"|>,metric:true}<tool_call|>`)
    come back as JSON arguments on every endpoint."""

    def test_calls_on_every_endpoint(self):
        r = oai().chat.completions.create(model=MODEL_ID, messages=ASK, max_tokens=120, temperature=0,
                                          tools=[CHAT_TOOL], tool_choice="required", parallel_tool_calls=False)
        self.assertEqual(r.choices[0].finish_reason, "tool_calls", r)
        self.assertTrue(valid_forecast(r.choices[0].message.tool_calls[0].function.arguments))
        tool = {"name": "get_forecast", "input_schema": FORECAST}
        m = claude().messages.create(model=MODEL_ID, max_tokens=120, messages=ASK, tools=[tool],
                                     tool_choice={"type": "tool", "name": "get_forecast"})
        self.assertEqual(m.content[-1].type, "tool_use", m.content)
        self.assertTrue(valid_forecast(m.content[-1].input))
        resp = oai().responses.create(model=MODEL_ID, input="What is the weather in Paris?", max_output_tokens=120,
                                      tools=[{"type": "function", "name": "get_forecast", "parameters": FORECAST}],
                                      tool_choice={"type": "function", "name": "get_forecast"})
        self.assertEqual(resp.output[-1].type, "function_call", resp.output)
        self.assertTrue(valid_forecast(resp.output[-1].arguments))

    def test_thinking_switch(self):
        off = oai().chat.completions.create(model=MODEL_ID, messages=ASK, max_tokens=1, temperature=0)
        on = oai().chat.completions.create(model=MODEL_ID, messages=ASK, max_tokens=1, temperature=0,
                                           extra_body={"chat_template_kwargs": {"enable_thinking": True}})
        # Thinking on adds `<|think|>` to a system turn; off closes an empty thought channel.
        self.assertNotEqual(on.usage.prompt_tokens, off.usage.prompt_tokens)


if __name__ == "__main__":
    unittest.main(verbosity=2)
