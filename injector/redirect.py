"""The `transparent` capture: an init container that redirects the pod's outbound web traffic.

For clients that ignore proxy variables (the JVM, some Go builds): one iptables rule in
the pod's network namespace sends every outbound TCP connection to ports 80 and 443 to
the sidecar's transparent listener, which reads the original destination and names the
host by TLS SNI or HTTP Host (hosts that are not intercepted are tunnelled untouched).
The sidecar's own connections are exempt by its UID: without that they would loop back
into it.

The rule needs NET_ADMIN (and NET_RAW for iptables) and root, in a short-lived init
container of the sidecar's image (which ships `iptables`, the nf_tables variant: it needs
no lock file, so the root file system stays read-only). Those capabilities are beyond
the baseline Pod Security Standard.

IPv4 only: the transparent listener is on 127.0.0.1, so an IPv6 rule would send
connections nowhere; IPv6 traffic simply bypasses the sidecar.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from injector import names

PORTS = (80, 443)

# iptables runs for a moment; the pod's effective requests are the larger of these and
# the sum of its containers', so they cost nothing.
_RESOURCES = {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}}


def iptables_rule(port: int, sidecar_uid: int) -> list[str]:
    """The iptables command that redirects outbound 80/443, except the sidecar's, to `port`."""
    return [
        "iptables", "-t", "nat", "-A", "OUTPUT", "-p", "tcp",
        "-m", "multiport", "--dports", ",".join(str(p) for p in PORTS),
        "-m", "owner", "!", "--uid-owner", str(sidecar_uid),
        "-j", "REDIRECT", "--to-ports", str(port),
    ]  # fmt: skip


def redirect_container(image: str, pull_policy: str, port: int, sidecar_uid: int) -> dict[str, Any]:
    """The init container that installs the rule (a second run adds an identical rule)."""
    return {
        "name": names.REDIRECT_CONTAINER,
        "image": image,
        "imagePullPolicy": pull_policy,
        "command": iptables_rule(port, sidecar_uid),
        "resources": {key: dict(value) for key, value in _RESOURCES.items()},
        "securityContext": {
            "runAsUser": 0,
            "runAsGroup": 0,
            "runAsNonRoot": False,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN", "NET_RAW"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }


def shares_sidecar_uid(container: Mapping[str, Any], pod_context: object, sidecar_uid: int) -> bool:
    """Whether the container is set to run as the sidecar's UID (its traffic is then exempt)."""
    context = container.get("securityContext")
    uid = context.get("runAsUser") if isinstance(context, Mapping) else None
    if uid is None and isinstance(pod_context, Mapping):
        uid = pod_context.get("runAsUser")
    return uid == sidecar_uid
