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
from typing import Any, TextIO

import yaml

from injector import ready, review, server
from injector.settings import ConfigError, InjectorSettings, load_file

logger = logging.getLogger(__name__)


class RenderError(ValueError):
    """The input of `render` is not a single Pod."""


class _Dumper(yaml.SafeDumper):
    """Plain YAML: no `&id001` anchors where two fields happen to hold equal objects."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render(source: TextIO, out: TextIO, err: TextIO, settings: InjectorSettings, ns: str) -> None:
    """Read a Pod (YAML or JSON), write the injected Pod as YAML; warnings go to `err`."""
    try:
        pod = yaml.safe_load(source)
    except yaml.YAMLError as e:
        raise RenderError(f"the input is not YAML or JSON: {e}") from None
    if not isinstance(pod, dict) or pod.get("kind", "Pod") != "Pod":
        raise RenderError("the input must be one Pod")
    injection = review.inject(pod, settings, review.describe(pod, ns))
    if not injection.decision.inject:
        for reason in injection.decision.reasons:
            print(f"not injected: {reason.sentence}", file=err)
    for warning in injection.warnings:
        print(f"warning: {warning}", file=err)
    yaml.dump(injection.pod, out, Dumper=_Dumper, sort_keys=False)


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

    render_command = commands.add_parser("render", help="inject a Pod read from stdin")
    render_command.add_argument("--config", type=Path, help=config_help)
    render_command.add_argument(
        "--namespace", default="", help="the Pod's namespace, for messages (default: its own)"
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
            render(sys.stdin, sys.stdout, sys.stderr, settings, args.namespace)
        else:
            url = ready.healthz_url(args.host, args.port)
            if args.command == "wait":
                return 0 if ready.wait_healthy(url, args.timeout) else 1
            return ready.prime(args.sidecar, url, args.timeout)
    except (ConfigError, RenderError) as e:
        print(f"burstbuffer-injector: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"burstbuffer-injector: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
