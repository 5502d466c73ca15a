"""Raw HTTP and server-sent-event helpers for the tests that must go below the official clients:
malformed bodies, clients that hang up mid-stream, and strict checks of the stream grammar.

Standard library only (http.client), so these tests need nothing beyond the venv's Python.
"""
import http.client
import json
import os
import urllib.parse

URL = os.environ.get("WEFT_URL", "http://127.0.0.1:8080")
API_KEY = os.environ.get("WEFT_API_KEY", "")
MODEL_ID = os.environ.get("WEFT_MODEL_ID", "default_model")


def connection(timeout=120):
    u = urllib.parse.urlparse(URL)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)


def auth_headers(key=None):
    key = API_KEY if key is None else key
    return {"Authorization": f"Bearer {key}"} if key else {}


def request(method, path, body=None, headers=None, raw=None, timeout=120):
    """Returns (status, headers dict with lower-case names, parsed JSON body or text)."""
    conn = connection(timeout)
    h = {"Content-Type": "application/json"}
    h.update(auth_headers() if headers is None else headers)
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    conn.request(method, path, body=data, headers=h)
    resp = conn.getresponse()
    text = resp.read().decode("utf-8", "replace")
    conn.close()
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = text
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, parsed


class SSEStream:
    """A streaming POST read event by event. `close()` hangs up (a disconnecting client)."""

    def __init__(self, path, body, headers=None, timeout=120):
        self.conn = connection(timeout)
        h = {"Content-Type": "application/json"}
        h.update(auth_headers() if headers is None else headers)
        self.conn.request("POST", path, body=json.dumps(body).encode(), headers=h)
        self.resp = self.conn.getresponse()
        self.status = self.resp.status
        self.content_type = self.resp.getheader("Content-Type", "")

    def events(self):
        """Yields (event name or None, data string) per SSE event, until the body ends."""
        name, data = None, []
        while True:
            line = self.resp.readline()
            if not line:
                if data:
                    yield name, "\n".join(data)
                return
            line = line.decode("utf-8").rstrip("\r\n")
            if line == "":
                if data:
                    yield name, "\n".join(data)
                name, data = None, []
            elif line.startswith(":"):
                continue
            elif line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
            else:
                raise AssertionError(f"not an SSE line: {line!r}")

    def close(self):
        # Closing the socket (not draining it) is what a client that goes away does.
        try:
            self.conn.sock.shutdown(2)
        except (OSError, AttributeError):
            pass
        self.resp.close()
        self.conn.close()


def check_openai_stream(events, kind="chat", include_usage=False):
    """Checks a complete OpenAI stream and returns (text, finish_reason, usage or None).

    Grammar: `data: {chunk}`* then `data: [DONE]`; one id throughout; chat streams open with
    the assistant role; exactly one chunk has a finish_reason and it is the last choice chunk;
    with include_usage, one usage chunk with no choices follows it.
    """
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    text, finish, usage, ids, done = [], None, None, set(), False
    first = True
    for name, data in events:
        assert not done, f"data after [DONE]: {data!r}"
        assert name is None, f"OpenAI streams have no event names, got {name!r}"
        if data == "[DONE]":
            done = True
            continue
        chunk = json.loads(data)
        assert "error" not in chunk, f"error in stream: {chunk}"
        assert chunk["object"] == obj, chunk
        ids.add(chunk["id"])
        if not chunk["choices"]:
            assert include_usage and finish is not None and usage is None, chunk
            usage = chunk["usage"]
            continue
        assert usage is None, "choices after the usage chunk"
        (choice,) = chunk["choices"]
        assert choice["index"] == 0
        assert finish is None, f"chunk after finish_reason: {chunk}"
        if kind == "chat":
            delta = choice["delta"]
            if first:
                assert delta.get("role") == "assistant", chunk
            text.append(delta.get("content") or "")
        else:
            text.append(choice["text"])
        first = False
        if choice["finish_reason"] is not None:
            finish = choice["finish_reason"]
            assert finish in ("stop", "length"), finish
    assert done, "no [DONE]"
    assert len(ids) == 1, ids
    assert finish is not None, "no finish_reason"
    if include_usage:
        assert usage is not None, "no usage chunk"
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    return "".join(text), finish, usage


def check_anthropic_stream(events):
    """Checks a complete Anthropic Messages stream; returns (text, stop_reason, usage).

    Grammar: message_start, content_block_start(0), ping?, content_block_delta(0)*,
    content_block_stop(0), message_delta, message_stop; each `data` repeats its event name as
    `type`.
    """
    seq = [(name, json.loads(data)) for name, data in events]
    for name, d in seq:
        assert d["type"] == name, (name, d)
        assert name != "error", d
    names = [n for n, _ in seq]
    assert names[0] == "message_start", names
    msg = seq[0][1]["message"]
    assert msg["role"] == "assistant" and msg["content"] == [] and msg["stop_reason"] is None, msg
    assert names[1] == "content_block_start" and seq[1][1]["index"] == 0, names
    assert seq[1][1]["content_block"] == {"type": "text", "text": ""}
    rest = names[2:]
    if rest and rest[0] == "ping":
        rest = rest[1:]
    assert rest[-3:] == ["content_block_stop", "message_delta", "message_stop"], names
    assert all(n == "content_block_delta" for n in rest[:-3]), names
    text = "".join(d["delta"]["text"] for n, d in seq if n == "content_block_delta")
    assert all(d["index"] == 0 and d["delta"]["type"] == "text_delta" for n, d in seq if n == "content_block_delta")
    delta = next(d for n, d in seq if n == "message_delta")
    assert delta["delta"]["stop_reason"] in ("end_turn", "max_tokens", "stop_sequence"), delta
    return text, delta["delta"]["stop_reason"], delta["usage"]
