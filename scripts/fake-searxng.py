#!/usr/bin/env python3
"""A SearXNG-format search server for measuring vaultd from outside its own code.

Standard library only (http.server's ThreadingHTTPServer: a thread per connection, the GIL,
HTTP/1.1 keep-alive), so nothing about it was tuned with vaultd in mind — unlike the Rust fake
in tests/util/searx.rs, whose answer costs a few microseconds and flatters the figures.

It answers what vaultd's `search_web` asks (src/tools/builtin/search_web/searxng.rs):
`GET {base}/search?q=…&format=json&pageno=N` with `Accept: application/json`, three results a
page, titled from the query, in the shape tests/util/searx.rs gives (url, title, content,
engine, …; `unresponsive_engines` empty). Anything else is a 404; `format` other than `json`
is a 403, as SearXNG does when json is not in `search.formats`. `GET /stats` gives the requests
served and the handler's own time summed (JSON), for a caller that wants to subtract it.

    scripts/fake-searxng.py              # 127.0.0.1, a free port
    scripts/fake-searxng.py --port 8888

The first line on stdout is `listening on http://127.0.0.1:PORT` (flushed at once): a caller
reads it to learn the port. It runs until killed (SIGTERM or SIGINT end it quietly).
"""

import argparse
import json
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

RESULTS_PER_PAGE = 3

_stats_lock = threading.Lock()
_stats = {"requests": 0, "busy_us": 0, "in_flight": 0, "max_in_flight": 0}


def results_page(query, page):
    """One page of results, as tests/util/searx.rs `results_json` builds it."""
    results = []
    for i in range(1, RESULTS_PER_PAGE + 1):
        n = (page - 1) * RESULTS_PER_PAGE + i
        results.append(
            {
                "url": f"https://example.org/{n}",
                "title": f"{query} result {n}",
                "content": f"snippet {n} about {query}",
                "engine": "brave",
                "engines": ["brave", "google"],
                "score": 1.0,
                "category": "general",
                "template": "default.html",
                "positions": [n],
                "publishedDate": None,
            }
        )
    return {
        "query": query,
        "number_of_results": 0,
        "results": results,
        "answers": [],
        "corrections": [],
        "infoboxes": [],
        "suggestions": [],
        "unresponsive_engines": [],
    }


class Handler(BaseHTTPRequestHandler):
    # Keep-alive, as a real SearXNG behind a web server gives: reqwest keeps its connections.
    protocol_version = "HTTP/1.1"
    # Headers and body are two writes: without TCP_NODELAY the second waits for the client's
    # delayed ACK (up to 40 ms) and the fake would measure Nagle, not vaultd.
    disable_nagle_algorithm = True

    def do_GET(self):
        started = time.perf_counter()
        with _stats_lock:
            _stats["in_flight"] += 1
            _stats["max_in_flight"] = max(_stats["max_in_flight"], _stats["in_flight"])
        try:
            self._answer()
        finally:
            took = int((time.perf_counter() - started) * 1e6)
            with _stats_lock:
                _stats["in_flight"] -= 1
                _stats["requests"] += 1
                _stats["busy_us"] += took

    def _answer(self):
        url = urlsplit(self.path)
        if url.path == "/stats":
            with _stats_lock:
                self._send(200, "application/json", json.dumps(_stats))
            return
        if url.path.rstrip("/") != "/search":
            self._send(404, "text/plain", "not found")
            return
        params = parse_qs(url.query, keep_blank_values=True)
        if params.get("format", [""])[0] != "json":
            self._send(403, "text/plain", "format not allowed")
            return
        query = params.get("q", [""])[0]
        try:
            page = max(1, int(params.get("pageno", ["1"])[0]))
        except ValueError:
            page = 1
        self._send(200, "application/json", json.dumps(results_page(query, page)))

    def _send(self, status, ctype, text):
        body = text.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):
        # One line per request on stderr would cost more than the answer.
        pass


class Server(ThreadingHTTPServer):
    # Connection threads never hold up the exit.
    daemon_threads = True
    # listen(2)'s backlog: a burst of new connections (10 workers at once) is never refused.
    request_queue_size = 128


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 (default): a free port")
    args = parser.parse_args()
    server = Server((args.host, args.port), Handler)

    def stop(_signum, _frame):
        # shutdown() waits for serve_forever(), which runs in this thread: exit instead.
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    host, port = server.server_address[:2]
    print(f"listening on http://{host}:{port}", flush=True)
    try:
        server.serve_forever()
    except SystemExit:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
