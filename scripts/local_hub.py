"""A local Hugging Face Hub for by-hand checks and the Swift suite: serves goldens/models/qwen3
(+ the gemma3-vision tokenizer) as repo org/tiny in the Hub's URL layout (the API's revision and
tree listings, `resolve` with LFS redirects to a `/cdn/` that honours `Range`), as
tests/support/hub.rs does for the Rust tests. Unknown repos answer 401 RepoNotFound.

    from local_hub import start; endpoint = start()      # in a thread of this process
    python3 scripts/local_hub.py PORT_FILE                # serve until killed; the URL goes to PORT_FILE
"""
import hashlib, json, os, sys, threading
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WEFT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/release/weft")
REPO = "org/tiny"
FILES = {}
for src in ["goldens/models/qwen3", "goldens/models/gemma3-vision"]:
    for n in sorted(os.listdir(os.path.join(ROOT, src))):
        if src.endswith("qwen3") or n.startswith("tokenizer"):
            FILES[n] = open(os.path.join(ROOT, src, n), "rb").read()
COMMIT = hashlib.sha1(REPO.encode()).hexdigest()
SHA = {n: hashlib.sha256(b).hexdigest() for n, b in FILES.items()}
GIT = {n: hashlib.sha1(b"blob %d\0" % len(b) + b).hexdigest() for n, b in FILES.items()}
LOG = []


class Hub(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def send(self, code, headers, body=b"", length=None):
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        p = self.path.split("?")[0]
        LOG.append(f"{self.command} {p}")
        if p.startswith(f"/api/models/{REPO}/revision/"):
            body = json.dumps({"id": REPO, "sha": COMMIT, "siblings": [{"rfilename": n} for n in FILES]})
            return self.send(200, [("Content-Type", "application/json")], body.encode())
        if p.startswith(f"/api/models/{REPO}/tree/"):  # huggingface_hub's file listing
            body = json.dumps([{"type": "file", "path": n, "size": len(b), "oid": GIT[n],
                                **({"lfs": {"oid": SHA[n], "size": len(b), "pointerSize": 134}} if n.endswith(".safetensors") else {})}
                               for n, b in FILES.items()])
            return self.send(200, [("Content-Type", "application/json")], body.encode())
        if p.startswith("/cdn/"):
            b = next(FILES[n] for n in FILES if SHA[n] == p[5:])
            start = int(self.headers["Range"].split("=")[1].rstrip("-")) if self.headers.get("Range") else 0
            if start:
                return self.send(206, [("Content-Range", f"bytes {start}-{len(b) - 1}/{len(b)}")], b[start:])
            return self.send(200, [], b)
        prefix = f"/{REPO}/resolve/"
        if p.startswith(prefix):
            name = p[len(prefix):].split("/", 1)[1]
            if name not in FILES:
                return self.send(404, [("X-Error-Code", "EntryNotFound")])
            b = FILES[name]
            if name.endswith(".safetensors"):
                return self.send(302, [("X-Repo-Commit", COMMIT), ("X-Linked-Etag", f'"{SHA[name]}"'),
                                       ("X-Linked-Size", str(len(b))), ("Location", f"http://localhost:{self.server.server_address[1]}/cdn/{SHA[name]}")])
            return self.send(200, [("X-Repo-Commit", COMMIT), ("ETag", f'"{GIT[name]}"')], b, len(b))
        self.send(401, [("X-Error-Code", "RepoNotFound")])


def start():
    """Serves in a daemon thread; returns the endpoint URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}"


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write(f"http://127.0.0.1:{server.server_address[1]}")
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])
    server.serve_forever()
