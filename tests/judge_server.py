"""A scripted OpenAI-compatible judge server on 127.0.0.1 for the judge tests: a real HTTP
server (the standard library's) whose replies come from a Python function of the request, so
a test can have a judge that answers late, answers without a score, answers 7 on a 0..1 scale,
or stops answering after a few requests, and see how the client counts each case.

    with JudgeServer(lambda body: "fine.\\nSCORE: 0.5") as server:
        Judge(server.url).judge(episodes)
        server.bodies                 # every request body received, in order

`delay(body)` (seconds, default 0) is slept before answering; after `die_after` requests
the server closes its socket, so later requests are refused (a judge server dying mid-step).
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable


class JudgeServer:
    def __init__(self, reply: Callable[[dict[str, Any]], str], delay: Callable[[dict[str, Any]], float] | None = None,
                 die_after: int | None = None, model: str = "scripted-judge"):
        self.reply, self.delay, self.die_after, self.model = reply, delay, die_after, model
        self.bodies: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                self._send(200, {"object": "list", "data": [{"id": outer.model, "object": "model"}]})

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                with outer._lock:
                    outer.bodies.append(body)
                    n = len(outer.bodies)
                if outer.die_after is not None and n > outer.die_after:
                    threading.Thread(target=outer.stop, daemon=True).start()
                    self.close_connection = True
                    return  # no answer: the connection closes
                if outer.delay is not None:
                    time.sleep(outer.delay(body))
                text = outer.reply(body)
                self._send(200, {"id": f"c{n}", "object": "chat.completion", "model": outer.model,
                                 "choices": [{"index": 0, "finish_reason": "stop",
                                              "message": {"role": "assistant", "content": text}}],
                                 "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._stopped = False

    def start(self) -> "JudgeServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> "JudgeServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
