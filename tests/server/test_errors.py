"""Bad inputs against `weft serve` (started with --api-key, --strict-model and a small --kv-budget on the tiny
goldens GGUF, context 2048): each gets a 4xx with its protocol's error JSON, checked both on the
wire and through the official clients' exception classes, and the server keeps serving.

    WEFT_URL=... WEFT_API_KEY=... WEFT_MODEL_ID=tiny .venv/bin/python tests/server/test_errors.py
"""
import unittest

import anthropic
import openai

from wire import API_KEY, MODEL_ID, URL, SSEStream, check_openai_stream, request

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES = "/v1/messages"
HELLO = [{"role": "user", "content": "hello"}]


def chat_body(**kw):
    return {"model": MODEL_ID, "messages": HELLO, "max_tokens": 4, **kw}


def message_body(**kw):
    return {"model": MODEL_ID, "messages": HELLO, "max_tokens": 4, **kw}


class Errors(unittest.TestCase):
    def assert_openai_error(self, status, got, code=400, param=None, needle=None):
        st, headers, body = got
        self.assertEqual(st, code, body)
        self.assertIn("application/json", headers.get("content-type", ""))
        self.assertIsInstance(body, dict, body)
        err = body["error"]
        self.assertIsInstance(err["message"], str)
        self.assertIn("type", err)
        if param is not None:
            self.assertEqual(err["param"], param, err)
        if needle is not None:
            self.assertIn(needle, err["message"])
        return err

    def assert_anthropic_error(self, got, code=400, kind="invalid_request_error", needle=None):
        st, headers, body = got
        self.assertEqual(st, code, body)
        self.assertEqual(body["type"], "error", body)
        self.assertEqual(body["error"]["type"], kind, body)
        if needle is not None:
            self.assertIn(needle, body["error"]["message"])

    def tearDown(self):
        # Whatever the last case sent, the server still answers.
        st, _, body = request("POST", CHAT, chat_body(max_tokens=2))
        self.assertEqual(st, 200, body)
        self.assertEqual(body["usage"]["completion_tokens"], 2)

    # ---- malformed bodies

    def test_malformed_json(self):
        for path in (CHAT, COMPLETIONS):
            self.assert_openai_error(None, request("POST", path, raw=b'{"messages": [}'), needle="invalid JSON")
        self.assert_anthropic_error(request("POST", MESSAGES, raw=b"{not json"), needle="invalid JSON")
        self.assert_openai_error(None, request("POST", CHAT, raw=b""), needle="invalid JSON")

    def test_body_not_an_object(self):
        self.assert_openai_error(None, request("POST", CHAT, raw=b"[1, 2]"), needle="JSON object")
        self.assert_anthropic_error(request("POST", MESSAGES, raw=b'"hi"'))

    def test_body_too_large(self):
        # The default --max-body-bytes is 4MB.
        raw = b'{"prompt": "' + b"a" * 4_000_000 + b'"}'
        self.assert_openai_error(None, request("POST", COMPLETIONS, raw=raw), code=413)

    # ---- wrong types and values

    def test_wrong_types(self):
        cases = [
            ("temperature", "hot"), ("temperature", -1), ("top_p", 0), ("top_p", 1.5), ("top_k", "x"),
            ("min_p", 2), ("max_tokens", 0), ("max_tokens", -5), ("max_tokens", 1.5), ("max_tokens", "10"),
            ("max_completion_tokens", 0), ("stream", "yes"), ("seed", "s"), ("stop", 5), ("stop", [1]),
            ("stop", [""]), ("logit_bias", [1]), ("logit_bias", {"x": 1}), ("logit_bias", {"99999": 1}),
            ("logit_bias", {"5": "big"}), ("logprobs", "yes"), ("top_logprobs", 21), ("n", 0), ("n", 99), ("n", "2"),
            ("chat_template_kwargs", "x"), ("reasoning_effort", "enormous"), ("reasoning_budget", -1),
            ("presence_penalty", "x"), ("repetition_penalty", -1), ("stream_options", 1), ("tools", [{"type": "function"}]),
            ("response_format", {"type": "json"}), ("response_format", {"type": "json_schema"}),
            ("response_format", {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nosuch"}}}),
            ("response_format", {"type": "json_schema", "json_schema": {"name": "x", "schema": False}}),
            ("regex", "("), ("regex", 5), ("grammar", "start: missing"), ("choice", []), ("choice", ["a", 1]),
            ("messages", "hello"), ("messages", []),
            ("messages", [{"role": "user"} , 5]), ("messages", [{"role": "wizard", "content": "x"}]),
            ("messages", [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
            ("messages", [{"role": "user", "content": 7}]),
        ]
        for field, value in cases:
            with self.subTest(field=field, value=value):
                param = "messages" if field == "messages" else field
                err = self.assert_openai_error(None, request("POST", CHAT, chat_body(**{field: value})))
                self.assertTrue(err["param"] == param or (err["param"] or "").startswith(param), err)
        st = request("POST", CHAT, {"model": MODEL_ID, "max_tokens": 2})
        self.assert_openai_error(None, st, param="messages")

    def test_completion_prompts(self):
        for prompt in (None, 5, [1.5], ["a", "b"], [[1], [2]], {"text": "x"}, [-1]):
            with self.subTest(prompt=prompt):
                body = {"model": MODEL_ID, "max_tokens": 2}
                if prompt is not None:
                    body["prompt"] = prompt
                self.assert_openai_error(None, request("POST", COMPLETIONS, body), param="prompt")
        # Token ids outside the vocabulary (1024) are the engine's call: still a 400.
        self.assert_openai_error(None, request("POST", COMPLETIONS, {"prompt": [5, 5000], "max_tokens": 2}), needle="vocabulary")
        self.assert_openai_error(None, request("POST", COMPLETIONS, {"prompt": "", "max_tokens": 2}), needle="empty")

    def test_anthropic_wrong_types(self):
        cases = [
            {"max_tokens": None}, {"max_tokens": 0}, {"max_tokens": "4"}, {"messages": []}, {"messages": "hi"},
            {"messages": [{"role": "system", "content": "x"}]}, {"messages": [{"role": "user"}]},
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            {"system": 5}, {"system": [{"type": "text"}]}, {"stop_sequences": "x,y".split(",") + [3]},
            {"temperature": "warm"}, {"top_k": -3}, {"stream": 1},
            {"tools": [{"name": "f"}]}, {"tools": [{"name": "f", "input_schema": {"type": "string"}}]},
        ]
        for patch in cases:
            with self.subTest(patch=patch):
                body = message_body(**patch)
                body = {k: v for k, v in body.items() if v is not None}
                self.assert_anthropic_error(request("POST", MESSAGES, body))

    # ---- model, context, KV budget

    def test_unknown_model(self):
        # --strict-model: other names are a 404 naming the served model.
        err = self.assert_openai_error(None, request("POST", CHAT, chat_body(model="gpt-4o")), code=404, param="model")
        self.assertEqual(err["code"], "model_not_found")
        self.assertIn(f"`{MODEL_ID}`", err["message"])  # echoes the served model
        self.assert_anthropic_error(request("POST", MESSAGES, message_body(model="claude-x")), code=404,
                                    kind="not_found_error", needle=MODEL_ID)
        self.assert_openai_error(None, request("GET", "/v1/models/nope"), code=404)
        # Known names: the served id and mlx_lm.server's default_model.
        for name in (MODEL_ID, "default_model"):
            self.assertEqual(request("POST", CHAT, chat_body(model=name))[0], 200)
        st, _, body = request("POST", CHAT, chat_body(model=5))
        self.assertEqual(st, 400, body)

    def test_prompt_over_context(self):
        # The tiny model's context is 2048 tokens.
        err = self.assert_openai_error(None, request("POST", COMPLETIONS, {"prompt": [5] * 2049, "max_tokens": 2}))
        self.assertIn("context", err["message"])
        long_text = "hello " * 2100
        self.assert_openai_error(None, request("POST", CHAT, chat_body(messages=[{"role": "user", "content": long_text}])),
                                 needle="context")
        self.assert_anthropic_error(request("POST", MESSAGES, message_body(messages=[{"role": "user", "content": long_text}])),
                                    needle="context")

    def test_over_kv_budget(self):
        # --kv-budget 1MB holds about 650 tokens of this model's KV (1536 bytes a token, float32).
        err = self.assert_openai_error(None, request("POST", CHAT, chat_body(max_tokens=1900)), needle="KV")
        self.assertIn("bytes", err["message"])
        self.assert_anthropic_error(request("POST", MESSAGES, message_body(max_tokens=1900)), needle="KV")
        # A request that fits still runs.
        self.assertEqual(request("POST", CHAT, chat_body(max_tokens=200))[0], 200)

    # ---- API key, paths, methods

    def test_api_key(self):
        if not API_KEY:
            self.skipTest("server started without --api-key")
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"x-api-key": "wrong"}, {"Authorization": API_KEY}):
            with self.subTest(headers=headers):
                err = self.assert_openai_error(None, request("POST", CHAT, chat_body(), headers=headers), code=401)
                self.assertEqual(err["code"], "invalid_api_key")
                self.assert_anthropic_error(request("POST", MESSAGES, message_body(), headers=headers), code=401,
                                            kind="authentication_error")
                for path in ("/v1/models", "/stats", "/metrics"):
                    self.assertEqual(request("GET", path, headers=headers)[0], 401, path)
        self.assertEqual(request("POST", CHAT, chat_body(), headers={"x-api-key": API_KEY})[0], 200)
        self.assertEqual(request("POST", MESSAGES, message_body(), headers={"x-api-key": API_KEY})[0], 200)
        st, _, body = request("GET", "/health", headers={})
        self.assertEqual((st, body["status"]), (200, "ok"))
        # The official clients raise their authentication errors.
        with self.assertRaises(openai.AuthenticationError):
            openai.OpenAI(base_url=URL + "/v1", api_key="wrong", max_retries=0).models.list()
        with self.assertRaises(anthropic.AuthenticationError):
            anthropic.Anthropic(base_url=URL, api_key="wrong", max_retries=0).messages.create(
                model=MODEL_ID, max_tokens=2, messages=HELLO)

    def test_unknown_path_and_method(self):
        self.assert_openai_error(None, request("POST", "/v1/embeddings", {}), code=404)
        self.assert_openai_error(None, request("GET", CHAT), code=405)
        self.assert_anthropic_error(request("GET", MESSAGES), code=405)
        st, headers, _ = request("OPTIONS", CHAT, headers={"Origin": "http://localhost:3000"})
        self.assertEqual(st, 204)
        self.assertEqual(headers.get("access-control-allow-origin"), "http://localhost:3000")

    def test_official_clients_raise_bad_request(self):
        client = openai.OpenAI(base_url=URL + "/v1", api_key=API_KEY or "none", max_retries=0)
        with self.assertRaises(openai.BadRequestError) as cm:
            client.chat.completions.create(model=MODEL_ID, messages=HELLO, max_tokens=4, top_p=3)
        self.assertEqual(cm.exception.status_code, 400)
        with self.assertRaises(openai.NotFoundError):
            client.completions.create(model="nope", prompt="x", max_tokens=2)
        claude = anthropic.Anthropic(base_url=URL, api_key=API_KEY or "none", max_retries=0)
        with self.assertRaises(anthropic.BadRequestError) as cm:
            claude.messages.create(model=MODEL_ID, max_tokens=5000, messages=HELLO)
        self.assertEqual(cm.exception.body["error"]["type"], "invalid_request_error")
        with self.assertRaises(anthropic.NotFoundError):
            claude.messages.create(model="claude-nope", max_tokens=2, messages=HELLO)

    def test_streaming_requests_fail_before_the_stream(self):
        # A bad streaming request is a plain 4xx JSON error, not a broken event stream.
        s = SSEStream(CHAT, chat_body(stream=True, temperature=-2))
        self.assertEqual(s.status, 400)
        self.assertIn("application/json", s.content_type)
        s.close()
        s = SSEStream(CHAT, chat_body(stream=True, max_tokens=3, ignore_eos=True))
        self.assertEqual(s.status, 200)
        text, finish, _ = check_openai_stream(s.events())
        self.assertEqual(finish, "length")


if __name__ == "__main__":
    unittest.main(verbosity=2)
