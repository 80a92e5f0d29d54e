"""Origins that speak more than HTTP/1.1, for the tests of what the sidecar tunnels.

Run as a process (`python tests/protocol_origin.py --grpc ADDR:PORT --ws ADDR:PORT
--cert F --key F`), beside the sidecar or inside a pod's network namespace:

- a gRPC server (grpcio, TLS, ALPN `h2` only): `/burstbuffer.test.Echo/Say` answers
  `echo:` and the request's bytes;
- a WebSocket server (websockets, TLS, HTTP/1.1 upgrade): echoes every message;
  `/refuse` is answered `403` with a body instead of an upgrade.

It prints `ready` once both listen. The clients below are what a user would write,
run as their own processes with only the environment a pod gives them.
"""

from __future__ import annotations

import argparse
import http
import ssl
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ECHO_METHOD = "/burstbuffer.test.Echo/Say"
REFUSED_PATH = "/refuse"
REFUSED_BODY = "no WebSocket here\n"

# grpcio's unary call, as generated stubs make it: `python -c GRPC_CLIENT TARGET ROOTS`;
# it honours `https_proxy` (and `grpc_proxy`) by itself.
GRPC_CLIENT = (
    "import grpc, sys\n"
    "roots = open(sys.argv[2], 'rb').read()\n"
    "with grpc.secure_channel(sys.argv[1], grpc.ssl_channel_credentials(roots)) as channel:\n"
    f"    say = channel.unary_unary({ECHO_METHOD!r})\n"
    "    print(say(b'hello', timeout=30).decode())\n"
)
# websockets' client: `python -c WS_CLIENT URL ROOTS`; it honours `https_proxy` by
# itself. Sends 1 MiB (incompressible) and reads it back, then a word; or prints the
# refusal's status and body.
WS_CLIENT = (
    "import os, ssl, sys\n"
    "from websockets.exceptions import InvalidStatus\n"
    "from websockets.sync.client import connect\n"
    "context = ssl.create_default_context(cafile=sys.argv[2])\n"
    "try:\n"
    "    with connect(sys.argv[1], ssl=context, open_timeout=30, max_size=None) as ws:\n"
    "        message = os.urandom(2**20)\n"
    "        ws.send(message)\n"
    "        assert ws.recv(timeout=30) == message\n"
    "        ws.send('hello')\n"
    "        print(ws.recv(timeout=30))\n"
    "except InvalidStatus as e:\n"
    "    print('refused', e.response.status_code, e.response.body.decode().strip())\n"
)


def grpc_server(address: str, cert: bytes, key: bytes):  # type: ignore[no-untyped-def]
    import grpc

    def say(request: bytes, context: object) -> bytes:
        return b"echo:" + request

    server = grpc.server(ThreadPoolExecutor(4))
    handler = grpc.unary_unary_rpc_method_handler(say)
    service, method = ECHO_METHOD.strip("/").split("/")
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler(service, {method: handler})]
    )
    if server.add_secure_port(address, grpc.ssl_server_credentials([(key, cert)])) == 0:
        raise OSError(f"gRPC cannot listen on {address}")
    server.start()
    return server


def ws_server(host: str, port: int, cert: Path, key: Path):  # type: ignore[no-untyped-def]
    from websockets.sync.server import ServerConnection, serve

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)

    def echo(connection: ServerConnection) -> None:
        for message in connection:
            connection.send(message)

    def refuse(connection: ServerConnection, request):  # type: ignore[no-untyped-def]
        if request.path == REFUSED_PATH:
            return connection.respond(http.HTTPStatus.FORBIDDEN, REFUSED_BODY)
        return None

    server = serve(echo, host, port, ssl=context, process_request=refuse, max_size=None)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grpc", required=True, help="ADDRESS:PORT of the gRPC server")
    parser.add_argument("--ws", required=True, help="ADDRESS:PORT of the WebSocket server")
    parser.add_argument("--cert", type=Path, required=True)
    parser.add_argument("--key", type=Path, required=True)
    args = parser.parse_args()
    grpc = grpc_server(args.grpc, args.cert.read_bytes(), args.key.read_bytes())
    host, _, port = args.ws.rpartition(":")
    ws_server(host, int(port), args.cert, args.key)
    print("ready", flush=True)
    try:
        threading.Event().wait()  # until the test stops us
    finally:
        grpc.stop(0)


if __name__ == "__main__":
    main()
