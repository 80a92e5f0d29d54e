"""Another mutating webhook for pods of the test cluster, as a platform team would run
beside ours: it adds a container of its own to every pod it is sent.

`python3 other_webhook.py DIR PORT` serves `POST /mutate` over HTTPS with DIR's tls.crt
and tls.key, and answers each pod creation with a JSONPatch that puts $INIT_CONTAINER
(JSON) first among the init containers and appends $CONTAINER (JSON) to the containers,
unless the pod has them already. It logs one line per review (`mutated <pod>`). Runs on
the app image's Python (3.11) with the standard library only.
"""

import base64
import http.server
import json
import os
import ssl
import sys


def patch(pod: dict, init_container: dict, container: dict) -> list[dict]:
    """The JSONPatch operations that add both containers to `pod` (none already there)."""
    spec = pod.get("spec") or {}
    present = {c.get("name") for c in spec.get("initContainers", []) + spec.get("containers", [])}
    operations = []
    if init_container["name"] not in present:
        if spec.get("initContainers"):
            first = {"path": "/spec/initContainers/0", "value": init_container}
        else:
            first = {"path": "/spec/initContainers", "value": [init_container]}
        operations.append({"op": "add", **first})
    if container["name"] not in present:
        operations.append({"op": "add", "path": "/spec/containers/-", "value": container})
    return operations


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    init_container: dict = {}
    container: dict = {}

    def do_POST(self) -> None:
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        request = review["request"]
        pod = request["object"]
        operations = patch(pod, self.init_container, self.container)
        response = {"uid": request["uid"], "allowed": True}
        if operations:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(operations).encode()).decode()
        body = json.dumps({**review, "response": response}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        name = pod.get("metadata", {}).get("name") or pod.get("metadata", {}).get("generateName")
        print(f"mutated {name}: {len(operations)} operation(s)", flush=True)

    def log_message(self, format: str, *args: object) -> None:
        pass  # one line per review, above


def main() -> None:
    directory, port = sys.argv[1], int(sys.argv[2])
    Handler.init_container = json.loads(os.environ["INIT_CONTAINER"])
    Handler.container = json.loads(os.environ["CONTAINER"])
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(f"{directory}/tls.crt", f"{directory}/tls.key")
    server = http.server.ThreadingHTTPServer(("", port), Handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    print(f"serving on {port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
