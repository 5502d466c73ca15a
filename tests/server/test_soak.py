"""Soak: storms of concurrent streamed requests against `weft serve` (the tiny goldens GGUF),
a share of whose clients hang up mid-stream, repeated; the server's memory must settle.

Checks, per storm: every stream that was not aborted ends with a finish reason (strict
grammar, see wire.py), no request errors, the engine drains to zero rows with no KV held.
Across storms: the server's RSS after the last storm is within 10% of its RSS after the first
(each read once the server has been idle for SETTLE_S: the engine returns MLX's buffer cache
and the heap's free pages when it goes idle, and the HTTP side frees its buffers after that).

    WEFT_URL=... WEFT_PID=<server pid> WEFT_MODEL_ID=tiny .venv/bin/python tests/server/test_soak.py
    SOAK_STORMS=10 SOAK_CLIENTS=500 ...   # the longer run reported in docs/server.md

Prints one line per storm: clients, finished, aborted, seconds, RSS in MB.
"""
import concurrent.futures
import os
import time
import unittest

from wire import MODEL_ID, SSEStream, check_anthropic_stream, check_openai_stream, request

STORMS = int(os.environ.get("SOAK_STORMS", "5"))
CLIENTS = int(os.environ.get("SOAK_CLIENTS", "300"))
PID = int(os.environ["WEFT_PID"])
STORM_DEADLINE_S = 240
SETTLE_S = 2.5


def rss_mb():
    with open(f"/proc/{PID}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def aborts(storm, i):
    # 35% of the clients, a different set each storm.
    return (i * 7 + storm * 3) % 20 < 7


def client(storm, i):
    kind = ("chat", "completion", "messages")[(i + storm) % 3]
    quitter = aborts(storm, i)
    max_tokens = 200 if quitter else 8 + (i % 4) * 8
    content = f"storm {storm} request {i}: say something."
    if kind == "chat":
        path, body = "/v1/chat/completions", {
            "model": MODEL_ID, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "stream": True, "ignore_eos": quitter or i % 2 == 0, "temperature": 0.7 if i % 5 == 0 else 0, "seed": i,
        }
    elif kind == "completion":
        path, body = "/v1/completions", {
            "model": MODEL_ID, "prompt": content, "max_tokens": max_tokens, "stream": True, "ignore_eos": quitter,
        }
    else:
        path, body = "/v1/messages", {
            "model": MODEL_ID, "max_tokens": max_tokens, "stream": True,
            "messages": [{"role": "user", "content": content}], "ignore_eos": quitter,
        }
    s = SSEStream(path, body, timeout=STORM_DEADLINE_S)
    assert s.status == 200, (storm, i, s.status)
    if quitter:
        for n, _ in enumerate(s.events()):
            if n == 1:
                break
        s.close()
        return "aborted"
    events = list(s.events())
    s.close()
    if kind == "messages":
        _, stop, _ = check_anthropic_stream(events)
        assert stop in ("end_turn", "max_tokens"), stop
    else:
        _, finish, _ = check_openai_stream(events, kind="chat" if kind == "chat" else "completion")
        assert finish in ("stop", "length"), finish
    return "finished"


def wait_idle():
    deadline = time.monotonic() + 60
    while True:
        st, _, stats = request("GET", "/stats")
        assert st == 200
        idle = (stats["active_rows"], stats["queued_rows"], stats["prefilling_rows"], stats["kv_bytes_in_use"],
                stats["requests_in_flight"]) == (0, 0, 0, 0, 0)
        if idle:
            return stats
        assert time.monotonic() < deadline, f"rows left behind: {stats}"
        time.sleep(0.1)


class Soak(unittest.TestCase):
    def test_storms(self):
        self.assertGreaterEqual(CLIENTS, 1)
        rss = []
        totals = {"finished": 0, "aborted": 0}
        for storm in range(STORMS):
            start = time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
                futures = [pool.submit(client, storm, i) for i in range(CLIENTS)]
                results = [f.result(timeout=STORM_DEADLINE_S) for f in futures]
            elapsed = time.monotonic() - start
            wait_idle()
            time.sleep(SETTLE_S)
            rss.append(rss_mb())
            st, _, stats = request("GET", "/stats")
            self.assertEqual(st, 200)
            # An idle engine has given MLX's buffer cache back (rows cancelled after the
            # last step included).
            self.assertEqual(stats["mlx_cache_bytes"], 0, stats)
            counts = {k: results.count(k) for k in ("finished", "aborted")}
            self.assertEqual(counts["finished"] + counts["aborted"], CLIENTS)
            self.assertGreaterEqual(counts["aborted"], 0.3 * CLIENTS)
            for k in counts:
                totals[k] += counts[k]
            print(f"storm {storm + 1}/{STORMS}: {CLIENTS} clients, {counts['finished']} finished, "
                  f"{counts['aborted']} aborted, {elapsed:.1f}s, RSS {rss[-1]:.1f} MB", flush=True)
        st, _, text = request("GET", "/metrics")
        self.assertEqual(st, 200)
        self.assertIn('weft_requests_finished_total{reason="error"} 0', text)
        print(f"total: {totals['finished']} finished, {totals['aborted']} aborted, 0 errors; "
              f"RSS first {rss[0]:.1f} MB, last {rss[-1]:.1f} MB ({(rss[-1] / rss[0] - 1) * 100:+.1f}%)")
        self.assertLessEqual(rss[-1], rss[0] * 1.10, f"RSS grew across storms: {rss}")


if __name__ == "__main__":
    unittest.main(verbosity=2)
