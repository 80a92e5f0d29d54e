"""A dataset origin for pods of the test cluster: HTTPS, HTTP/1.1, files of known content.

`python3 origin.py DIR PORT` serves, with DIR's tls.crt and tls.key, the files named in
$ORIGIN_FILES (JSON: path -> size), whose bytes are a function of the path, and logs one
line per request (`"GET /path HTTP/1.1" 200`), which the tests count. Runs on the app
image's Python (3.11) with the standard library only.
"""

import hashlib
import http.server
import json
import os
import ssl
import sys


def content(path: str, size: int) -> bytes:
    """The bytes of `path`: SHA-256 blocks of the path and a counter, cut at `size`."""
    blocks = (size + 31) // 32
    seed = path.encode()
    return b"".join(hashlib.sha256(seed + i.to_bytes(8, "big")).digest() for i in range(blocks))[
        :size
    ]


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    files: dict[str, bytes] = {}

    def do_GET(self) -> None:
        self.answer(body=True)

    def do_HEAD(self) -> None:
        self.answer(body=False)

    def answer(self, body: bool) -> None:
        data = self.files.get(self.path)
        if data is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Last-Modified", "Tue, 24 Nov 2026 00:00:00 GMT")
        self.end_headers()
        if body:
            self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        print(format % args, flush=True)


def main() -> None:
    folder, port = sys.argv[1], int(sys.argv[2])
    sizes = json.loads(os.environ["ORIGIN_FILES"])
    Handler.files = {path: content(path, size) for path, size in sizes.items()}
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(os.path.join(folder, "tls.crt"), os.path.join(folder, "tls.key"))
    server = http.server.ThreadingHTTPServer(("", port), Handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
