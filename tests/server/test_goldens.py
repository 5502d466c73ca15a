"""The official Python clients (`openai`, `anthropic`) against `weft serve` on the default model
(SmolLM2-135M-Instruct): greedy outputs equal mlx-lm's goldens (goldens/smollm2.json), on
/v1/chat/completions and /v1/completions (streaming and not) and /v1/messages (streaming and not).

Every golden request is sent at once from a thread pool in setUpClass, so they batch together
in the engine (the goldens hold for batched rows too); the test methods then check the answers.
Behaviour that needs no golden (stop strings, seeds, logit bias, ...) is checked on the tiny
model by test_features.py, where generation is fast.

    WEFT_URL=http://127.0.0.1:8080 WEFT_API_KEY=... WEFT_MODEL_ID=... \
    WEFT_GOLDENS=goldens/smollm2.json .venv/bin/python tests/server/test_goldens.py
"""
import concurrent.futures
import json
import os
import unittest

import anthropic
import openai

from wire import API_KEY, MODEL_ID, URL

GOLDENS = json.load(open(os.environ.get("WEFT_GOLDENS", "goldens/smollm2.json")))
CHATS = GOLDENS["chats"]
MAX_TOKENS = 48  # what the goldens were generated with
# anthropic 2.x has no `temperature` argument any more; the wire field is still honoured.
GREEDY = {"temperature": 0}


def oai():
    return openai.OpenAI(base_url=URL + "/v1", api_key=API_KEY or "none", max_retries=0, timeout=300)


def claude():
    return anthropic.Anthropic(base_url=URL, api_key=API_KEY or "none", max_retries=0, timeout=300)


def split_system(messages):
    system = [m["content"] for m in messages if m["role"] == "system"]
    rest = [m for m in messages if m["role"] != "system"]
    return ("\n".join(system) if system else None), rest


# ---- one function per way of asking; each returns what the checks need


def chat(case):
    r = oai().chat.completions.create(model=MODEL_ID, messages=case["messages"], max_tokens=MAX_TOKENS, temperature=0)
    return {"text": r.choices[0].message.content, "finish": r.choices[0].finish_reason, "usage": r.usage}


def chat_stream(case):
    stream = oai().chat.completions.create(
        model=MODEL_ID, messages=case["messages"], max_completion_tokens=MAX_TOKENS, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage, roles = [], None, None, []
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.role:
                roles.append(c.delta.role)
            text.append(c.delta.content or "")
            finish = c.finish_reason or finish
    return {"text": "".join(text), "finish": finish, "usage": usage, "roles": roles}


def completion(case):
    r = oai().completions.create(model=MODEL_ID, prompt=case["prompt_text"], max_tokens=MAX_TOKENS, temperature=0)
    return {"text": r.choices[0].text, "finish": r.choices[0].finish_reason, "usage": r.usage}


def completion_stream(case):
    stream = oai().completions.create(
        model=MODEL_ID, prompt=case["prompt_text"], max_tokens=MAX_TOKENS, temperature=0, stream=True
    )
    text, finish = [], None
    for chunk in stream:
        for c in chunk.choices:
            text.append(c.text)
            finish = c.finish_reason or finish
    return {"text": "".join(text), "finish": finish}


def message(case):
    system, rest = split_system(case["messages"])
    kw = {"system": system} if system else {}
    r = claude().messages.create(model=MODEL_ID, max_tokens=MAX_TOKENS, messages=rest, extra_body=GREEDY, **kw)
    assert [b.type for b in r.content] == ["text"], r.content
    return {"text": r.content[0].text, "stop": r.stop_reason, "usage": r.usage, "role": r.role, "type": r.type}


def message_stream(case):
    system, rest = split_system(case["messages"])
    kw = {"system": system} if system else {}
    with claude().messages.stream(model=MODEL_ID, max_tokens=MAX_TOKENS, messages=rest, extra_body=GREEDY, **kw) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    return {"text": text, "final_text": final.content[0].text, "stop": final.stop_reason, "usage": final.usage}


def chat_logprobs(case):
    r = oai().chat.completions.create(
        model=MODEL_ID, messages=case["messages"], max_tokens=MAX_TOKENS, temperature=0, logprobs=True, top_logprobs=3
    )
    return {"text": r.choices[0].message.content, "logprobs": r.choices[0].logprobs}


# Which chats each way is checked on. Prefill on this CPU backend runs at tens of tokens a
# second, so not every way runs every chat: the plain chat endpoint covers all four, the others
# the cases that matter for them.
PLAN = {
    chat: [0, 1, 2, 3],
    chat_stream: [1],
    completion: [0],
    completion_stream: [0],
    message: [1, 2],  # the system prompt as `system`; a multi-turn conversation
    message_stream: [0],
    chat_logprobs: [0],
}


class Goldens(unittest.TestCase):
    results = {}

    @classmethod
    def setUpClass(cls):
        jobs = [(way, i) for way, chats in PLAN.items() for i in chats]
        with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
            futures = {(way.__name__, i): pool.submit(way, CHATS[i]) for way, i in jobs}
            for key, f in futures.items():
                try:
                    cls.results[key] = f.result()
                except Exception as e:  # reported by the test that needs it
                    cls.results[key] = e

    def each(self, way, check):
        """Runs `check(golden case, result)` for every chat `way` was asked, as subtests."""
        for i in PLAN[way]:
            with self.subTest(chat=i):
                r = self.results[(way.__name__, i)]
                if isinstance(r, Exception):
                    raise r
                check(CHATS[i], r)

    def check_usage(self, usage, case):
        self.assertEqual(usage.prompt_tokens, len(case["prompt_ids"]))
        self.assertEqual(usage.completion_tokens, len(case["tokens"]))
        self.assertEqual(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens)

    def test_chat_completions(self):
        def check(case, r):
            self.assertEqual(r["text"], case["text"])
            self.assertEqual(r["finish"], case["finish_reason"])
            self.check_usage(r["usage"], case)

        self.each(chat, check)

    def test_chat_completions_streaming(self):
        def check(case, r):
            self.assertEqual(r["text"], case["text"])
            self.assertEqual(r["finish"], case["finish_reason"])
            self.assertEqual(r["roles"], ["assistant"])
            self.check_usage(r["usage"], case)

        self.each(chat_stream, check)

    def test_completions(self):
        def check(case, r):
            self.assertEqual(r["text"], case["text"])
            self.assertEqual(r["finish"], case["finish_reason"])
            self.check_usage(r["usage"], case)

        self.each(completion, check)

    def test_completions_streaming(self):
        def check(case, r):
            self.assertEqual(r["text"], case["text"])
            self.assertEqual(r["finish"], case["finish_reason"])

        self.each(completion_stream, check)

    def test_anthropic_messages(self):
        def check(case, r):
            self.assertEqual((r["type"], r["role"]), ("message", "assistant"))
            self.assertEqual(r["text"], case["text"])
            self.assertEqual(r["stop"], "end_turn")
            u = r["usage"]
            self.assertEqual(u.input_tokens + (u.cache_read_input_tokens or 0), len(case["prompt_ids"]))
            self.assertEqual(u.output_tokens, len(case["tokens"]))

        self.each(message, check)

    def test_anthropic_messages_streaming(self):
        def check(case, r):
            self.assertEqual(r["text"], case["text"])
            self.assertEqual(r["final_text"], case["text"])
            self.assertEqual(r["stop"], "end_turn")
            self.assertEqual(r["usage"].output_tokens, len(case["tokens"]))

        self.each(message_stream, check)

    def test_logprobs(self):
        def check(case, r):
            self.assertEqual(r["text"], case["text"])
            content = r["logprobs"].content
            self.assertEqual(len(content), len(case["tokens"]))
            self.assertEqual("".join(c.token for c in content), case["text"])
            for c in content:
                self.assertEqual(len(c.top_logprobs), 3)
                # Greedy: the chosen token is the most likely one.
                self.assertEqual(c.top_logprobs[0].token, c.token)
                self.assertAlmostEqual(c.top_logprobs[0].logprob, c.logprob, places=5)
                self.assertLessEqual(c.logprob, 0.0)
                self.assertGreaterEqual(c.top_logprobs[0].logprob, c.top_logprobs[1].logprob)
                self.assertEqual(bytes(c.bytes).decode("utf-8", "replace"), c.token)

        self.each(chat_logprobs, check)

    def test_models(self):
        self.assertEqual([m.id for m in oai().models.list().data], [MODEL_ID])


if __name__ == "__main__":
    unittest.main(verbosity=2)
