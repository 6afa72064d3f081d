"""A real HTTP server on localhost for the remote-source and staging tests: Python's
ThreadingHTTPServer serving a directory, with Range requests, directory listings (for globs),
and two faults a real network has: a connection dropped in the middle of a body, and a slow
link. Every request is logged as (method, file name, first byte asked for)."""

from __future__ import annotations

import dataclasses
import http.server
import os
import re
import socket
import threading
import time
from pathlib import Path


@dataclasses.dataclass
class Drop:
    """Cut GET answers for one file after absolute byte `at`, the first `times` times (-1: always)."""

    at: int
    times: int = 1


class Server:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.drops: dict[str, Drop] = {}
        self.bytes_per_second: float | None = None  # a slow link when set
        self.log: list[tuple[str, str, int]] = []
        self.lock = threading.Lock()
        server = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *a, **kw):
                super().__init__(*a, directory=str(server.root), **kw)

            def log_message(self, *args):  # quiet
                pass

            def do_HEAD(self):
                path = self.translate_path(self.path)
                if not os.path.isfile(path):
                    return super().do_HEAD()
                with server.lock:
                    server.log.append(("HEAD", os.path.basename(path), 0))
                self.send_response(200)
                self.send_header("Content-Length", str(os.path.getsize(path)))
                self.send_header("Accept-Ranges", "bytes")
                self.end_headers()

            def do_GET(self):
                path = self.translate_path(self.path)
                if not os.path.isfile(path):
                    return super().do_GET()  # 404, or a directory listing
                size = os.path.getsize(path)
                start, end = 0, size  # [start, end)
                m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
                if m:
                    start = int(m[1])
                    end = min(size, int(m[2]) + 1) if m[2] else size
                    if start >= size:
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{size}")
                        self.end_headers()
                        return
                name = os.path.basename(path)
                with server.lock:
                    server.log.append(("GET", name, start))
                    drop = server.drops.get(name)
                    cut = None
                    if drop is not None and drop.times != 0 and start <= drop.at < end:
                        cut = drop.at
                        drop.times -= drop.times > 0
                self.send_response(206 if m else 200)
                self.send_header("Content-Length", str(end - start))
                self.send_header("Accept-Ranges", "bytes")
                if m:
                    self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
                self.end_headers()
                with open(path, "rb") as f:
                    f.seek(start)
                    pos = start
                    stop = end if cut is None else cut
                    while pos < stop:
                        data = f.read(min(64 << 10, stop - pos))
                        try:
                            self.wfile.write(data)
                        except (BrokenPipeError, ConnectionResetError):  # the client went away
                            self.close_connection = True
                            return
                        pos += len(data)
                        if server.bytes_per_second:
                            time.sleep(len(data) / server.bytes_per_second)
                if cut is not None:  # the connection drops in the middle of the body
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def gets(self, name: str) -> list[int]:
        """The first byte of every GET of file `name`, in order."""
        with self.lock:
            return [start for method, n, start in self.log if method == "GET" and n == name]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
