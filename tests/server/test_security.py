"""The sidecar's security defaults (issue 19) against `weft serve` on the tiny goldens GGUF,
started by tests/server.rs with --api-key and small limits (--max-body-bytes 1MB,
--max-messages 4, --max-tokens-limit 64, --max-connections 8); CORS and Host checks are the
defaults.

    WEFT_URL=... WEFT_API_KEY=... WEFT_MODEL_ID=tiny .venv/bin/python tests/server/test_security.py
"""
import http.client
import json
import socket
import time
import unittest
import urllib.parse

import openai

from wire import API_KEY, MODEL_ID, URL, auth_headers, connection, request

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
HELLO = [{"role": "user", "content": "hello"}]
PORT = urllib.parse.urlparse(URL).port
HOST = urllib.parse.urlparse(URL).hostname


def chat_body(**kw):
    return {"model": MODEL_ID, "messages": HELLO, "max_tokens": 2, **kw}


def with_auth(**headers):
    return {**auth_headers(), **headers}


def metric(name):
    st, _, text = request("GET", "/metrics")
    assert st == 200
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


class Origins(unittest.TestCase):
    FOREIGN = ("https://evil.example", "http://localhost.evil.example:8080", "null", "http://127.0.0.1.nip.io")
    LOCAL = ("http://localhost:5173", "http://127.0.0.1:3000", "http://[::1]:8080", "tauri://localhost", "app://weft")

    def test_foreign_preflight_refused(self):
        for origin in self.FOREIGN:
            with self.subTest(origin=origin):
                st, headers, body = request("OPTIONS", CHAT, headers={
                    "Origin": origin, "Access-Control-Request-Method": "POST",
                    "Access-Control-Request-Headers": "authorization, content-type"})
                self.assertEqual(st, 403, body)
                self.assertNotIn("access-control-allow-origin", headers)
                self.assertEqual(body["error"]["type"], "permission_error", body)

    def test_foreign_simple_requests_refused_before_generating(self):
        # A "simple" cross-origin request (no preflight): the browser sends it and hides the
        # answer, so the server itself must refuse to run it.
        before = metric("weft_requests_in_flight"), metric('weft_http_requests_total{endpoint="chat_completions",status="200"}')
        for origin in self.FOREIGN:
            with self.subTest(origin=origin):
                st, headers, body = request("POST", CHAT, raw=json.dumps(chat_body()).encode(),
                                            headers=with_auth(Origin=origin, **{"Content-Type": "text/plain"}))
                self.assertEqual(st, 403, body)
                self.assertNotIn("access-control-allow-origin", headers)
                st, _, body = request("POST", MESSAGES, chat_body(), headers=with_auth(Origin=origin))
                self.assertEqual((st, body["type"], body["error"]["type"]), (403, "error", "permission_error"), body)
                st, _, _ = request("GET", "/v1/models", headers=with_auth(Origin=origin))
                self.assertEqual(st, 403)
        after = metric("weft_requests_in_flight"), metric('weft_http_requests_total{endpoint="chat_completions",status="200"}')
        self.assertEqual(before, after)

    def test_local_origins_allowed(self):
        for origin in self.LOCAL:
            with self.subTest(origin=origin):
                st, headers, _ = request("OPTIONS", CHAT, headers={
                    "Origin": origin, "Access-Control-Request-Method": "POST",
                    "Access-Control-Request-Headers": "authorization, content-type"})
                self.assertEqual(st, 204)
                self.assertEqual(headers["access-control-allow-origin"], origin)
                self.assertEqual(headers["vary"], "Origin")
                # `*` would not cover Authorization: the requested headers are echoed.
                self.assertEqual(headers["access-control-allow-headers"], "authorization, content-type")
                st, headers, body = request("POST", CHAT, chat_body(), headers=with_auth(Origin=origin))
                self.assertEqual(st, 200, body)
                self.assertEqual(headers["access-control-allow-origin"], origin)

    def test_no_origin_is_not_a_browser(self):
        st, headers, _ = request("POST", CHAT, chat_body())
        self.assertEqual(st, 200)
        self.assertNotIn("access-control-allow-origin", headers)


class Hosts(unittest.TestCase):
    def test_foreign_host_refused(self):
        # DNS rebinding: the page's own name resolves to 127.0.0.1; the browser sends it as Host.
        for host in (f"evil.example:{PORT}", "evil.example", f"127.0.0.1.nip.io:{PORT}", f"localhost.evil:{PORT}"):
            with self.subTest(host=host):
                for path in (CHAT, "/health", "/v1/models"):
                    method = "POST" if path == CHAT else "GET"
                    st, headers, body = request(method, path, chat_body() if method == "POST" else None,
                                                headers=with_auth(Host=host))
                    self.assertEqual(st, 403, (path, body))
                    self.assertIn("Host", body["error"]["message"])

    def test_loopback_hosts_allowed(self):
        for host in (f"localhost:{PORT}", f"127.0.0.1:{PORT}", f"LOCALHOST:{PORT}", "localhost"):
            with self.subTest(host=host):
                st, _, body = request("POST", CHAT, chat_body(), headers=with_auth(Host=host))
                self.assertEqual(st, 200, body)


def raw_exchange(head, body=b"", timeout=10):
    """Sends raw bytes; returns (status, parsed JSON body, seconds until the answer)."""
    s = socket.create_connection((HOST, PORT), timeout=timeout)
    start = time.monotonic()
    s.sendall(head + body)
    resp = http.client.HTTPResponse(s)
    resp.begin()
    data = resp.read()
    elapsed = time.monotonic() - start
    s.close()
    return resp.status, json.loads(data), elapsed


class Limits(unittest.TestCase):
    def test_declared_oversize_body_is_413_before_it_is_sent(self):
        # Only the headers go out: the 413 comes back although the body never existed, so it
        # was neither parsed nor tokenized.
        auth = "".join(f"{k}: {v}\r\n" for k, v in auth_headers().items())
        for path, kind in ((CHAT, "invalid_request_error"), ("/v1/completions", "invalid_request_error"),
                           (MESSAGES, "request_too_large"), ("/v1/messages/count_tokens", "request_too_large")):
            with self.subTest(path=path):
                head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{PORT}\r\n{auth}Content-Type: application/json\r\n"
                        f"Content-Length: {100 << 20}\r\n\r\n").encode()
                st, body, elapsed = raw_exchange(head)
                self.assertEqual(st, 413, body)
                err = body["error"]
                self.assertEqual(err["type"], kind, body)
                self.assertIn("larger than 1000000 bytes", err["message"])
                self.assertLess(elapsed, 5)

    def test_oversize_bodies_sent_are_413(self):
        big = json.dumps(chat_body(messages=[{"role": "user", "content": "a" * 1_100_000}])).encode()
        st, _, body = request("POST", CHAT, raw=big)
        self.assertEqual(st, 413, body)
        # Chunked, without a length: refused once the limit is crossed.
        auth = "".join(f"{k}: {v}\r\n" for k, v in auth_headers().items())
        head = (f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1:{PORT}\r\n{auth}Content-Type: application/json\r\n"
                "Transfer-Encoding: chunked\r\n\r\n").encode()
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in (big[i:i + 65536] for i in range(0, len(big), 65536)))
        st, body, _ = raw_exchange(head, chunks + b"0\r\n\r\n")
        self.assertEqual(st, 413, body)
        # Just under the limit is read (and then judged on its content).
        ok = json.dumps(chat_body(messages=[{"role": "user", "content": "a" * 900_000}])).encode()
        st, _, body = request("POST", CHAT, raw=ok)
        self.assertEqual(st, 400, body)
        self.assertIn("context", body["error"]["message"])

    def test_prompt_that_cannot_fit_is_refused_from_its_length(self):
        # 900 kB of text is at least tens of thousands of tokens for any vocabulary entry
        # length this model has: refused before tokenizing, naming the context.
        text = "word " * 180_000
        st, _, body = request("POST", CHAT, chat_body(messages=[{"role": "user", "content": text}]))
        self.assertEqual(st, 400, body)
        self.assertIn("longer than the model's context of 2048 tokens", body["error"]["message"])
        st, _, body = request("POST", "/v1/completions", {"prompt": text, "max_tokens": 2})
        self.assertIn("at least", body["error"]["message"])
        st, _, body = request("POST", MESSAGES, chat_body(messages=[{"role": "user", "content": text}]))
        self.assertEqual((st, body["error"]["type"]), (400, "invalid_request_error"), body)

    def test_message_count_and_max_tokens_ceiling(self):
        many = HELLO * 5
        st, _, body = request("POST", CHAT, chat_body(messages=many))
        self.assertEqual((st, body["error"]["param"]), (400, "messages"), body)
        self.assertIn("at most 4", body["error"]["message"])
        st, _, body = request("POST", MESSAGES, chat_body(messages=many))
        self.assertEqual((st, body["error"]["type"]), (400, "invalid_request_error"), body)
        self.assertEqual(request("POST", CHAT, chat_body(messages=HELLO * 4))[0], 200)
        for field in ("max_tokens", "max_completion_tokens"):
            st, _, body = request("POST", CHAT, chat_body(**{field: 65}))
            self.assertEqual(st, 400, body)
            self.assertIn("at most 64", body["error"]["message"])
        st, _, body = request("POST", MESSAGES, chat_body(max_tokens=65))
        self.assertEqual(st, 400, body)
        self.assertEqual(request("POST", CHAT, chat_body(max_tokens=64))[0], 200)

    def test_connection_limit(self):
        # 8 allowed; the wire helpers' own connection is closed after each request.
        time.sleep(0.3)  # earlier tests' connections are gone
        held = [socket.create_connection((HOST, PORT), timeout=10) for _ in range(8)]
        try:
            time.sleep(0.3)  # let the server accept them all

            auth = "".join(f"{k}: {v}\r\n" for k, v in auth_headers().items())

            def past_the_cap(path):
                extra = socket.create_connection((HOST, PORT), timeout=10)
                extra.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{PORT}\r\n{auth}\r\n".encode())
                resp = http.client.HTTPResponse(extra)
                resp.begin()
                body = json.loads(resp.read())
                extra.close()
                return resp.status, body

            status, body = past_the_cap("/v1/models")
            self.assertEqual(status, 429, body)
            self.assertIn("--max-connections", body["error"]["message"])
            # /health is still answered past the cap (issue 27).
            self.assertEqual(past_the_cap("/health"), (200, {"status": "ok", "model": MODEL_ID}))
        finally:
            for s in held:
                s.close()
        deadline = time.monotonic() + 10
        while request("GET", "/v1/models")[0] != 200:
            self.assertLess(time.monotonic(), deadline, "connections not released")
            time.sleep(0.1)


class Keys(unittest.TestCase):
    def test_health_open_everything_else_behind_the_key(self):
        self.assertTrue(API_KEY, "this suite runs against a server with --api-key")
        st, _, body = request("GET", "/health", headers={})
        self.assertEqual((st, body["status"]), (200, "ok"))
        for method, path in (("GET", "/v1/models"), ("GET", "/stats"), ("GET", "/metrics"), ("POST", CHAT),
                             ("POST", "/v1/completions"), ("POST", MESSAGES), ("POST", "/v1/messages/count_tokens"),
                             ("GET", "/v1/nothing")):
            with self.subTest(path=path):
                for headers in ({}, {"Authorization": "Bearer " + API_KEY[:-1]}, {"x-api-key": API_KEY + "x"}):
                    st, _, body = request(method, path, chat_body() if method == "POST" else None, headers=headers)
                    self.assertEqual(st, 401, (path, body))
                st, _, _ = request(method, path, chat_body() if method == "POST" else None)
                self.assertNotEqual(st, 401, path)

    def test_official_client_with_the_key(self):
        client = openai.OpenAI(base_url=URL + "/v1", api_key=API_KEY, max_retries=0)
        r = client.chat.completions.create(model="anything-the-client-likes", messages=HELLO, max_tokens=2)
        self.assertEqual(r.model, MODEL_ID)  # any name is accepted and the served id echoed


if __name__ == "__main__":
    unittest.main(verbosity=2)
