"""`burstbuffer status` and `burstbuffer check`: flags -> OpsSettings -> one command.

The one place that reads flags; exit status 0 on success, 1 when a check fails or the
cluster cannot be reached, 2 for bad flags (argparse's own). The same commands are the
kubectl plugin `kubectl burstbuffer` (kubectl runs `kubectl-burstbuffer` from the PATH
with the arguments after the plugin's name), which only names itself differently.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from injector.ops import check, output, status
from injector.ops.kube import ApiError, ConnectError, Target, connect


@dataclass(frozen=True)
class OpsSettings:
    command: str  # status | check
    target: Target
    namespace: str | None  # None: the kubeconfig context's namespace
    all_namespaces: bool
    output: str  # table | json | yaml
    injector: check.Injector


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text}")
    return value


def _parser(prog: str) -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--kubeconfig",
        help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, else in-cluster)",
    )
    common.add_argument("--context", help="kubeconfig context (default: the current one)")
    common.add_argument(
        "-n", "--namespace", help="namespace (default: the context's, else default)"
    )
    common.add_argument(
        "-o", "--output", choices=output.FORMATS, default="table", help="output format"
    )
    common.add_argument(
        "--request-timeout",
        type=_positive,
        default=10.0,
        help="seconds to wait for one API request (default 10)",
    )
    parser = argparse.ArgumentParser(
        prog=prog, description="Operate burstbuffer on a Kubernetes cluster."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    status_command = commands.add_parser(
        "status",
        parents=[common],
        help="every injected pod's buffer, hits and misses, from its sidecar's /stats",
    )
    status_command.add_argument(
        "-A", "--all-namespaces", action="store_true", help="injected pods of every namespace"
    )
    check_command = commands.add_parser(
        "check",
        parents=[common],
        help="is the injector installed, trusted and injecting the namespace's pods",
    )
    check_command.add_argument(
        "--injector-namespace",
        default=check.DEFAULT_INJECTOR_NAMESPACE,
        help=f"the release namespace (default {check.DEFAULT_INJECTOR_NAMESPACE})",
    )
    check_command.add_argument(
        "--injector-name",
        default=check.DEFAULT_INJECTOR_NAME,
        help="the injector's Deployment, Service and MutatingWebhookConfiguration "
        f"(default {check.DEFAULT_INJECTOR_NAME}: the chart's <release>-injector)",
    )
    return parser


def settings_from(argv: Sequence[str] | None, prog: str = "burstbuffer") -> OpsSettings:
    args = _parser(prog).parse_args(argv)
    return OpsSettings(
        command=args.command,
        target=Target(args.kubeconfig, args.context, args.request_timeout),
        namespace=args.namespace,
        all_namespaces=getattr(args, "all_namespaces", False),
        output=args.output,
        injector=check.Injector(
            getattr(args, "injector_namespace", check.DEFAULT_INJECTOR_NAMESPACE),
            getattr(args, "injector_name", check.DEFAULT_INJECTOR_NAME),
        ),
    )


def main(argv: Sequence[str] | None = None, prog: str = "burstbuffer") -> int:
    settings = settings_from(argv, prog)
    try:
        kube = connect(settings.target)
    except ConnectError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 1
    try:
        namespace = settings.namespace or kube.namespace
        if settings.command == "status":
            scope = None if settings.all_namespaces else namespace
            return status.run(kube, scope, settings.output, sys.stdout, sys.stderr)
        return check.run(kube, settings.injector, namespace, settings.output, sys.stdout)
    except (ConnectError, ApiError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 1
    finally:
        kube.close()


def kubectl_main() -> int:
    """`kubectl-burstbuffer`: the same CLI as a kubectl plugin."""
    return main(prog="kubectl burstbuffer")


if __name__ == "__main__":
    sys.exit(main())
