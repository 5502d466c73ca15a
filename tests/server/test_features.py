"""Request features through the official clients on the tiny goldens GGUF (random weights, a
small byte-level tokenizer and a chat template; fast on CPU): stop strings, max_tokens, seeds,
sampling fields, logit_bias, content parts, legacy completion logprobs, echo, count_tokens,
model names, /health, /stats, /metrics.

Outputs of a random model are meaningless, so each check compares the server with itself
(e.g. a stop string taken from a greedy answer must cut that answer there).

    WEFT_URL=... WEFT_API_KEY=... WEFT_MODEL_ID=tiny .venv/bin/python tests/server/test_features.py
"""
import unittest

import anthropic
import openai

from wire import API_KEY, MODEL_ID, URL, request

HELLO = [{"role": "user", "content": "Tell me about the sea."}]
GREEDY = {"temperature": 0, "ignore_eos": True}


def oai():
    return openai.OpenAI(base_url=URL + "/v1", api_key=API_KEY or "none", max_retries=0, timeout=120)


def claude():
    return anthropic.Anthropic(base_url=URL, api_key=API_KEY or "none", max_retries=0, timeout=120)


def greedy_chat(messages=HELLO, extra=None, **kw):
    return oai().chat.completions.create(model=MODEL_ID, messages=messages, extra_body={**GREEDY, **(extra or {})}, **kw)


class Features(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        r = greedy_chat(max_tokens=24, logprobs=True)
        cls.answer = r.choices[0].message.content
        cls.tokens = [c.token for c in r.choices[0].logprobs.content]
        assert len(cls.tokens) == 24 and "".join(cls.tokens) == cls.answer, (cls.answer, cls.tokens)

    def stop_string(self):
        """A stop string taken from the middle of the greedy answer, and the text before it."""
        for at in range(4, len(self.tokens)):
            stop = self.tokens[at].strip() or self.tokens[at]
            before = "".join(self.tokens[:at])
            cut = (before + self.tokens[at]).index(stop)
            if stop not in before and stop and cut > 0:
                return stop, (before + self.tokens[at])[:cut]
        self.skipTest(f"no usable stop string in {self.tokens}")

    def test_stop_strings(self):
        stop, expected = self.stop_string()
        r = greedy_chat(max_tokens=24, stop=[stop, "never-appears"])
        self.assertEqual(r.choices[0].message.content, expected)
        self.assertEqual(r.choices[0].finish_reason, "stop")
        stream = greedy_chat(max_tokens=24, stop=stop, stream=True)
        self.assertEqual("".join(c.choices[0].delta.content or "" for c in stream if c.choices), expected)
        m = claude().messages.create(model=MODEL_ID, max_tokens=24, messages=HELLO, stop_sequences=[stop],
                                     extra_body=GREEDY)
        self.assertEqual(m.content[0].text, expected)
        self.assertEqual((m.stop_reason, m.stop_sequence), ("stop_sequence", stop))
        with claude().messages.stream(model=MODEL_ID, max_tokens=24, messages=HELLO, stop_sequences=[stop],
                                      extra_body=GREEDY) as s:
            final = s.get_final_message()
        self.assertEqual((final.content[0].text, final.stop_reason, final.stop_sequence),
                         (expected, "stop_sequence", stop))

    def test_constrained_outputs(self):
        """response_format json_schema (strict) / json_object and the regex, grammar and choice
        extensions: a random model's output is valid only because the masks work."""
        import json
        import re
        schema = {"type": "object", "additionalProperties": False, "required": ["name", "n"],
                  "properties": {"name": {"type": "string", "maxLength": 8},
                                 "n": {"type": "integer", "minimum": 0, "maximum": 99}}}
        fmt = {"type": "json_schema", "json_schema": {"name": "thing", "schema": schema, "strict": True}}
        r = oai().chat.completions.create(model=MODEL_ID, messages=HELLO, max_tokens=60, temperature=0, response_format=fmt)
        v = json.loads(r.choices[0].message.content)
        self.assertEqual(sorted(v), ["n", "name"])
        self.assertTrue(isinstance(v["name"], str) and len(v["name"]) <= 8 and 0 <= v["n"] <= 99, v)
        self.assertEqual(r.choices[0].finish_reason, "stop")
        stream = oai().chat.completions.create(model=MODEL_ID, messages=HELLO, max_tokens=60, temperature=0,
                                               response_format=fmt, stream=True)
        self.assertEqual("".join(c.choices[0].delta.content or "" for c in stream if c.choices),
                         r.choices[0].message.content)
        r = oai().chat.completions.create(model=MODEL_ID, messages=HELLO, max_tokens=40, temperature=0,
                                          response_format={"type": "json_object"})
        self.assertTrue(r.choices[0].message.content.startswith("{"), r.choices[0].message.content)
        c = oai().completions.create(model=MODEL_ID, prompt="The sea", max_tokens=20, temperature=0,
                                     extra_body={"regex": "[a-z]{3,6}-[0-9]{2}"})
        self.assertRegex(c.choices[0].text, r"^[a-z]{3,6}-[0-9]{2}$")
        c = oai().completions.create(model=MODEL_ID, prompt="The sea", max_tokens=20, temperature=0,
                                     extra_body={"choice": ["calm", "rough", "frozen"]})
        self.assertIn(c.choices[0].text, ["calm", "rough", "frozen"])
        lark = 'start: "sea=" /[0-9]{1,3}/ ";"'
        r = greedy_chat(max_tokens=20, extra={"grammar": lark, "ignore_eos": False})
        self.assertTrue(re.fullmatch(r"sea=[0-9]{1,3};", r.choices[0].message.content), r.choices[0].message.content)
        # max_tokens inside the structure: length, not a silently truncated "valid" answer.
        r = oai().chat.completions.create(model=MODEL_ID, messages=HELLO, max_tokens=3, temperature=0, response_format=fmt)
        self.assertEqual(r.choices[0].finish_reason, "length")

    def test_max_tokens(self):
        r = greedy_chat(max_tokens=3)
        self.assertEqual((r.choices[0].finish_reason, r.usage.completion_tokens), ("length", 3))
        self.assertEqual(r.choices[0].message.content, "".join(self.tokens[:3]))
        r = greedy_chat(max_completion_tokens=5)
        self.assertEqual(r.usage.completion_tokens, 5)
        m = claude().messages.create(model=MODEL_ID, max_tokens=3, messages=HELLO, extra_body=GREEDY)
        self.assertEqual((m.stop_reason, m.usage.output_tokens), ("max_tokens", 3))
        self.assertEqual(m.content[0].text, "".join(self.tokens[:3]))

    def test_seeded_sampling_repeats(self):
        kw = dict(model=MODEL_ID, messages=HELLO, max_tokens=16, temperature=1.0, extra_body={"ignore_eos": True})
        a = oai().chat.completions.create(seed=7, **kw).choices[0].message.content
        b = oai().chat.completions.create(seed=7, **kw).choices[0].message.content
        c = oai().chat.completions.create(seed=8, **kw).choices[0].message.content
        self.assertEqual(a, b)
        self.assertNotEqual(a, c)

    def test_sampling_fields(self):
        r = oai().chat.completions.create(
            model=MODEL_ID, messages=HELLO, max_tokens=6, temperature=0.7, top_p=0.9, seed=1,
            presence_penalty=0.5, frequency_penalty=0.5,
            extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1, "repetition_context_size": 8,
                        "ignore_eos": True},
        )
        self.assertEqual(r.usage.completion_tokens, 6)
        # 1 and mlx_lm.server's 0 both mean "no repetition penalty".
        for off in (1.0, 0):
            r = greedy_chat(max_tokens=24, extra={"repetition_penalty": off})
            self.assertEqual(r.choices[0].message.content, self.answer)

    def test_logit_bias(self):
        # +100 on one token makes greedy pick it at every step.
        r = greedy_chat(max_tokens=4, logit_bias={"300": 100}, logprobs=True)
        tokens = [c.token for c in r.choices[0].logprobs.content]
        self.assertEqual(len(set(tokens)), 1, tokens)
        self.assertNotEqual(tokens, self.tokens[:4])

    def test_content_parts_equal_plain_text(self):
        parts = [{"type": "text", "text": "Tell me about "}, {"type": "text", "text": "the sea."}]
        r = greedy_chat([{"role": "user", "content": parts}], max_tokens=24)
        self.assertEqual(r.choices[0].message.content, self.answer)
        m = claude().messages.create(model=MODEL_ID, max_tokens=24, messages=[{"role": "user", "content": parts}],
                                     extra_body=GREEDY)
        self.assertEqual(m.content[0].text, self.answer)

    def test_anthropic_system_is_the_first_message(self):
        system = "You are terse."
        r = greedy_chat([{"role": "system", "content": system}] + HELLO, max_tokens=12)
        m = claude().messages.create(model=MODEL_ID, max_tokens=12, system=system, messages=HELLO, extra_body=GREEDY)
        self.assertEqual(m.content[0].text, r.choices[0].message.content)
        m = claude().messages.create(model=MODEL_ID, max_tokens=12, messages=HELLO, extra_body=GREEDY,
                                     system=[{"type": "text", "text": system}])
        self.assertEqual(m.content[0].text, r.choices[0].message.content)
        # input_tokens leaves out what the prompt cache (on by default) served.
        self.assertEqual(m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0), r.usage.prompt_tokens)
        n = claude().messages.count_tokens(model=MODEL_ID, system=system, messages=HELLO)
        self.assertEqual(n.input_tokens, r.usage.prompt_tokens)

    def test_completion_logprobs_and_echo(self):
        r = oai().completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=5, logprobs=2,
                                     extra_body=GREEDY)
        lp = r.choices[0].logprobs
        self.assertEqual(len(lp.tokens), 5)
        self.assertEqual("".join(lp.tokens), r.choices[0].text)
        self.assertEqual(len(lp.token_logprobs), 5)
        self.assertEqual(lp.text_offset[0], 0)
        for tok, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
            self.assertEqual(len(top), 2)
            self.assertAlmostEqual(max(top.values()), value, places=5)  # greedy
        e = oai().completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=5, echo=True,
                                     extra_body=GREEDY)
        self.assertEqual(e.choices[0].text, "Once upon a time" + r.choices[0].text)
        ids = oai().completions.create(model=MODEL_ID, prompt=[[5, 6, 7]], max_tokens=3, extra_body=GREEDY)
        self.assertEqual((ids.usage.prompt_tokens, ids.usage.completion_tokens), (3, 3))

    def test_streamed_logprobs(self):
        stream = greedy_chat(max_tokens=6, logprobs=True, top_logprobs=2, stream=True)
        tokens = [c.choices[0].logprobs.content[0].token for c in stream if c.choices and c.choices[0].logprobs]
        self.assertEqual(tokens, self.tokens[:6])

    def test_model_names(self):
        self.assertEqual([m.id for m in oai().models.list().data], [MODEL_ID])
        st, _, listed = request("GET", "/v1/models")
        (entry,) = listed["data"]
        self.assertTrue(entry["path"].endswith("goldens/gguf/llama-q4_1.gguf"), entry)
        self.assertEqual(oai().models.retrieve(MODEL_ID).id, MODEL_ID)
        self.assertEqual(oai().models.retrieve("llama-q4_1").id, MODEL_ID)
        with self.assertRaises(openai.NotFoundError):
            oai().models.retrieve("gpt-4o")
        # Any name is accepted (the official clients always send one) and the served id echoed.
        for name in (MODEL_ID, "default_model", "llama-q4_1.gguf", "llama-q4_1", "gpt-4o", "claude-x", ""):
            st, _, body = request("POST", "/v1/chat/completions",
                                  {"model": name, "messages": HELLO, "max_tokens": 1})
            self.assertEqual(st, 200, (name, body))
            self.assertEqual(body["model"], MODEL_ID)
        m = claude().messages.create(model="claude-whatever", max_tokens=1, messages=HELLO)
        self.assertEqual(m.model, MODEL_ID)

    def test_health_stats_metrics(self):
        st, headers, body = request("GET", "/health", headers={})
        self.assertEqual((st, body["status"]), (200, "ok"))
        st, headers, stats = request("GET", "/stats")
        self.assertEqual(st, 200)
        for key in ("active_rows", "queued_rows", "prefilling_rows", "kv_bytes_in_use", "kv_budget_bytes",
                    "tokens_generated", "requests_in_flight", "model", "uptime_s"):
            self.assertIn(key, stats)
        self.assertEqual(stats["model"], MODEL_ID)
        st, headers, text = request("GET", "/metrics")
        self.assertEqual(st, 200)
        self.assertTrue(headers["content-type"].startswith("text/plain"), headers)
        for name in ("weft_queue_depth", "weft_active_rows", "weft_kv_bytes_in_use", "weft_prompt_tokens_total",
                     "weft_generation_tokens_total", "weft_time_to_first_token_seconds_bucket",
                     "weft_inter_token_latency_seconds_bucket", "weft_http_requests_total"):
            self.assertIn(name, text)


if __name__ == "__main__":
    unittest.main(verbosity=2)
