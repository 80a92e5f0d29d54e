"""`burstbuffer-injector`: `serve` (the webhook), `render` (offline injection), and the
classic-sidecar helpers `wait` and `prime` that run inside injected pods.

The one place that reads flags and the environment; everything below gets typed values.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from injector import ready, server
from injector.render import RenderError, render
from injector.settings import ConfigError, load_file

logger = logging.getLogger(__name__)


RENDER_DESCRIPTION = """\
Reads Kubernetes manifests, YAML or JSON, from each -f FILE in turn (`-` is stdin), or
from stdin: one or several documents, of any kinds, `List`s included. Writes them to
stdout as YAML, in the same order and form (as many documents; a List stays a List),
with the pod template of every Pod, Deployment, StatefulSet, DaemonSet, ReplicaSet,
ReplicationController, Job, CronJob and PodTemplate injected exactly as the webhook
injects the pods made from it. It injects as if the namespace had opted in; a pod's own
opt-out and the never-inject rules still apply. Other objects (Services, ConfigMaps,
custom resources) are written unchanged.

On stderr, one line per object ("job/train: injected (capture proxy-env, buffer 1Gi
Memory)", "pod/x: not injected: <why>", "service/web: unchanged (no pod template)"), and
one per warning. Input that cannot be read, or an object that is not what its kind
says, writes nothing but one line, "error: <where>: <what>", and exits with status 2.
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="burstbuffer-injector",
        description="Injects the burstbuffer caching sidecar into pods.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    config_help = "the injector configuration (YAML); default: the built-in (chart) defaults"

    serve = commands.add_parser("serve", help="run the mutating admission webhook over TLS")
    serve.add_argument("--port", type=int, default=8443, help="TLS port (default 8443)")
    serve.add_argument("--host", default=None, help="address to bind (default: all)")
    serve.add_argument("--tls-cert", type=Path, required=True, help="certificate chain (PEM)")
    serve.add_argument("--tls-key", type=Path, required=True, help="private key (PEM)")
    serve.add_argument("--config", type=Path, help=config_help)

    render_command = commands.add_parser(
        "render",
        help="inject the pods of manifests offline (like istioctl kube-inject)",
        description=RENDER_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    render_command.add_argument("--config", type=Path, help=config_help)
    render_command.add_argument(
        "--namespace", default="", help="the objects' namespace in the log (default: their own)"
    )
    render_command.add_argument(
        "-f",
        "--filename",
        dest="files",
        action="append",
        default=[],
        metavar="FILE",
        help="a manifest file to read, `-` for stdin; repeatable (default: stdin)",
    )

    pod_ip = os.environ.get("POD_IP", "127.0.0.1")
    for name, text in (
        ("wait", "wait until the sidecar's /healthz answers (classic postStart hook)"),
        ("prime", "run the sidecar until healthy, then stop it (classic init container)"),
    ):
        helper = commands.add_parser(name, help=text)
        helper.add_argument("--host", default=pod_ip, help="admin address (default: $POD_IP)")
        helper.add_argument("--port", type=int, default=3129, help="admin port (default 3129)")
        helper.add_argument("--timeout", type=float, default=300.0, help="seconds (default 300)")
        if name == "prime":
            helper.add_argument("sidecar", nargs="+", help="the sidecar's command line")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        # render reports on stderr itself; the others log one line per event.
        level=logging.WARNING if args.command == "render" else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        if args.command == "serve":
            settings = load_file(args.config)
            tls = server.CertificateFiles(args.tls_cert, args.tls_key)
            asyncio.run(server.serve(settings, args.host, args.port, tls))
        elif args.command == "render":
            settings = load_file(args.config)
            render(args.files, sys.stdin.buffer, sys.stdout, sys.stderr, settings, args.namespace)
        else:
            url = ready.healthz_url(args.host, args.port)
            if args.command == "wait":
                return 0 if ready.wait_healthy(url, args.timeout) else 1
            return ready.prime(args.sidecar, url, args.timeout)
    except ConfigError as e:
        print(f"burstbuffer-injector: {e}", file=sys.stderr)
        return 2
    except RenderError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"burstbuffer-injector: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
