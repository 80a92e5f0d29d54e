"""Where the one-node cluster keeps everything, and its addresses: its one settings object.

The cluster lives in `.cluster/` of the checkout (the kubeconfig and `bin/` a user reads,
`state/` with etcd, containerd, the kubelet, certificates, logs and pid files) and in
`/run/burstbuffer-cluster` (containerd's sockets and runtime state). Its network is one
bridge with the pods' /24: the host's end of it is the node's address, where the API
server, the kubelet and the cluster's DNS listen, so nothing of the cluster listens
beyond loopback and that bridge, and IP forwarding stays off (pods reach each other
across the bridge, and nothing outside this machine).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Layout:
    """Paths and addresses of the cluster; the defaults are those `make cluster` uses."""

    home: Path = ROOT / ".cluster"
    run: Path = Path("/run/burstbuffer-cluster")
    node: str = "burstbuffer-node"
    bridge: str = "burstbuffer0"
    node_ip: str = "10.244.0.1"  # the bridge's address: the host, as pods see it
    pod_subnet: str = "10.244.0.0/24"
    pod_cidr: str = "10.244.0.0/16"  # what kube-proxy counts as the cluster's own traffic
    service_cidr: str = "10.96.0.0/16"
    service_ip: str = "10.96.0.1"  # the `kubernetes` Service: the first of service_cidr
    cluster_domain: str = "cluster.local"
    apiserver_port: int = 6443
    # Not etcd's defaults, so that an etcd of the machine's own is left alone.
    etcd_client_port: int = 23790
    etcd_peer_port: int = 23800

    @property
    def server(self) -> str:
        return f"https://{self.node_ip}:{self.apiserver_port}"

    @property
    def kubeconfig(self) -> Path:
        """The administrator's kubeconfig, for users and tests."""
        return self.home / "kubeconfig"

    @property
    def user_bin(self) -> Path:
        """kubectl and helm, for users."""
        return self.home / "bin"

    @property
    def state(self) -> Path:
        return self.home / "state"

    @property
    def pki(self) -> Path:
        return self.state / "pki"

    @property
    def logs(self) -> Path:
        return self.state / "logs"

    @property
    def pids(self) -> Path:
        return self.state / "pids"

    @property
    def volumes(self) -> Path:
        """Where local-path-provisioner makes a directory per volume claim."""
        return self.state / "volumes"

    @property
    def containerd_socket(self) -> Path:
        return self.run / "containerd.sock"
