"""A bounded load test on loopback: 64 concurrent streaming requests (OpenAI chat, OpenAI
completions and Anthropic messages, mixed), 20 of whose clients (31%) hang up mid-stream.

Checks: every stream that ran to its end is well-formed (strict grammar, see wire.py); every
hang-up cancelled its row (the disconnect counter); /stats returns to zero active, queued and
prefilling rows with no KV bytes held and no request in flight; /metrics is valid Prometheus
text with TTFT and inter-token histograms; the server still answers afterwards.

    WEFT_URL=... WEFT_MODEL_ID=tiny .venv/bin/python tests/server/test_load.py
"""
import concurrent.futures
import re
import time
import unittest

from wire import MODEL_ID, SSEStream, check_anthropic_stream, check_openai_stream, request

CLIENTS = 64
DEADLINE_S = 150  # the whole load phase; each client also has a socket timeout


def is_quitter(i):
    return i % 10 in (0, 3, 6)


def client(i):
    """One client; returns ("done", text) or ("quit", events read before hanging up)."""
    kind = ("chat", "completion", "messages")[i % 3]
    quitter = is_quitter(i)
    if quitter and kind == "messages":
        kind = "chat"
    # Quitters ask for long answers (EOS ignored) so they are surely mid-stream when they leave.
    max_tokens = 400 if quitter else 16 + (i % 5) * 8
    content = f"Request {i}: tell me something."
    if kind == "chat":
        path, body = "/v1/chat/completions", {
            "model": MODEL_ID, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": quitter or i % 2 == 0,
            "temperature": 0.8 if i % 4 == 1 else 0, "seed": i,
        }
    elif kind == "completion":
        path, body = "/v1/completions", {
            "model": MODEL_ID, "prompt": content, "max_tokens": max_tokens, "stream": True, "ignore_eos": quitter,
        }
    else:
        path, body = "/v1/messages", {
            "model": MODEL_ID, "max_tokens": max_tokens, "stream": True, "system": "Be brief.",
            "messages": [{"role": "user", "content": content}],
        }
    s = SSEStream(path, body, timeout=120)
    assert s.status == 200, (i, s.status)
    assert s.content_type.startswith("text/event-stream"), s.content_type
    if quitter:
        events = []
        for ev in s.events():
            events.append(ev)
            if len(events) == 3:
                break
        s.close()
        assert len(events) == 3, f"client {i}: stream ended before the hang-up: {events}"
        return "quit", events
    events = list(s.events())
    s.close()
    if kind == "messages":
        text, stop, usage = check_anthropic_stream(events)
        assert usage["output_tokens"] <= max_tokens
    else:
        text, finish, usage = check_openai_stream(events, kind="chat" if kind == "chat" else "completion",
                                                  include_usage=kind == "chat")
        if kind == "chat":
            assert usage["completion_tokens"] <= max_tokens
            if body["ignore_eos"]:
                assert (finish, usage["completion_tokens"]) == ("length", max_tokens), (finish, usage)
    return "done", text


def metrics():
    st, _, text = request("GET", "/metrics")
    assert st == 200
    values = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)', line)
        assert m, f"not a Prometheus sample line: {line!r}"
        values[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return values


class Load(unittest.TestCase):
    def test_64_streams_with_hangups(self):
        before = metrics()
        start = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
            futures = [pool.submit(client, i) for i in range(CLIENTS)]
            results = [f.result(timeout=DEADLINE_S) for f in futures]
        elapsed = time.monotonic() - start
        quits = sum(1 for kind, _ in results if kind == "quit")
        done = sum(1 for kind, _ in results if kind == "done")
        self.assertEqual(quits, sum(1 for i in range(CLIENTS) if is_quitter(i)))
        self.assertEqual(quits + done, CLIENTS)
        print(f"{CLIENTS} clients in {elapsed:.1f}s: {done} streams completed and well-formed, {quits} hung up")

        # No leaked rows: the engine drains to nothing.
        deadline = time.monotonic() + 30
        while True:
            st, _, stats = request("GET", "/stats")
            self.assertEqual(st, 200)
            idle = (stats["active_rows"], stats["queued_rows"], stats["prefilling_rows"], stats["kv_bytes_in_use"],
                    stats["requests_in_flight"]) == (0, 0, 0, 0, 0)
            if idle or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        self.assertTrue(idle, f"rows left behind: {stats}")

        after = metrics()
        delta = lambda k: after.get(k, 0) - before.get(k, 0)
        self.assertEqual(delta("weft_client_disconnects_total"), quits)
        self.assertEqual(delta('weft_requests_finished_total{reason="cancelled"}'), quits)
        finished = sum(delta(f'weft_requests_finished_total{{reason="{r}"}}') for r in ("stop", "length"))
        self.assertEqual(finished, done)
        self.assertEqual(delta('weft_requests_finished_total{reason="error"}'), 0)
        self.assertGreaterEqual(delta("weft_time_to_first_token_seconds_count"), CLIENTS)
        self.assertGreater(delta("weft_inter_token_latency_seconds_count"), CLIENTS)
        self.assertEqual(after['weft_time_to_first_token_seconds_bucket{le="+Inf"}'],
                         after["weft_time_to_first_token_seconds_count"])
        self.assertEqual(after["weft_active_rows"], 0)
        self.assertEqual(after["weft_queue_depth"], 0)
        self.assertEqual(delta('weft_http_requests_total{endpoint="chat_completions",status="200"}'),
                         sum(1 for i in range(CLIENTS) if i % 3 == 0 or (is_quitter(i) and i % 3 == 2)))

        # Still serving.
        st, _, body = request("POST", "/v1/chat/completions", {
            "model": MODEL_ID, "messages": [{"role": "user", "content": "still there?"}], "max_tokens": 3,
            "ignore_eos": True})
        self.assertEqual((st, body["usage"]["completion_tokens"]), (200, 3), body)


if __name__ == "__main__":
    unittest.main(verbosity=2)
