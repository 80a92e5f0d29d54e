"""The cluster's processes: each one's command line and configuration files.

Pure functions of the layout, the certificates and where the binaries are; nothing here
starts anything (`cluster` does). The flags are those of Kubernetes' own
`hack/local-up-cluster.sh` and kubeadm's static pods where they matter: the admission
plugins a real cluster enables, RBAC and the Node authorizer, service-account tokens,
the webhooks' Services resolved to their endpoints, a kubelet on containerd with a CNI
bridge.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.cluster.layout import Layout
from tests.cluster.pki import FRONT_PROXY_CLIENT, KUBELET_CLIENT, Pki

# Debian's containerd, runc and CNI plugins.
CONTAINERD = "/usr/bin/containerd"
CNI_BIN = "/usr/lib/cni"
# The pod sandbox image containerd runs (made locally from tools/pause).
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
# On top of the API server's defaults, as kubeadm enables it.
ADMISSION_PLUGINS = "NodeRestriction"
DNS_READY_PORT = 18181  # CoreDNS' ready plugin, on loopback
KUBE_PROXY_METRICS_PORT = 10249
KUBE_PROXY_HEALTHZ_PORT = 10256
# What the kubelet (10248 its health, 10250 its API), the controller manager (10257) and
# the scheduler (10259) listen on, by default.
DEFAULT_PORTS = (10248, 10250, 10257, 10259)


def fixed_ports(layout: Layout) -> set[int]:
    """Every port the cluster's processes listen on: no test's server may take one first
    (`bench.harness.free_port` looks above them)."""
    return {
        layout.etcd_client_port,
        layout.etcd_peer_port,
        layout.apiserver_port,
        DNS_READY_PORT,
        KUBE_PROXY_METRICS_PORT,
        KUBE_PROXY_HEALTHZ_PORT,
        *DEFAULT_PORTS,
    }


@dataclass(frozen=True)
class Component:
    """One process of the cluster."""

    name: str
    argv: tuple[str, ...]


def etcd(layout: Layout, binaries: Path) -> Component:
    client = f"http://127.0.0.1:{layout.etcd_client_port}"
    peer = f"http://127.0.0.1:{layout.etcd_peer_port}"
    return Component(
        "etcd",
        (
            str(binaries / "etcd"),
            "--name", layout.node,
            "--data-dir", str(layout.state / "etcd"),
            "--listen-client-urls", client,
            "--advertise-client-urls", client,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"{layout.node}={peer}",
            "--listen-metrics-urls", "",
            "--log-level", "warn",
        ),
    )  # fmt: skip


def apiserver(layout: Layout, binaries: Path, pki: Pki) -> Component:
    return Component(
        "kube-apiserver",
        (
            str(binaries / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{layout.etcd_client_port}",
            f"--bind-address={layout.node_ip}",
            f"--advertise-address={layout.node_ip}",
            f"--secure-port={layout.apiserver_port}",
            f"--tls-cert-file={pki.cert('apiserver')}",
            f"--tls-private-key-file={pki.key('apiserver')}",
            f"--client-ca-file={pki.ca}",
            f"--kubelet-client-certificate={pki.cert(KUBELET_CLIENT.name)}",
            f"--kubelet-client-key={pki.key(KUBELET_CLIENT.name)}",
            f"--kubelet-certificate-authority={pki.ca}",
            "--kubelet-preferred-address-types=InternalIP",
            f"--service-account-key-file={pki.service_account_public}",
            f"--service-account-signing-key-file={pki.service_account_key}",
            f"--service-account-issuer=https://kubernetes.default.svc.{layout.cluster_domain}",
            f"--service-cluster-ip-range={layout.service_cidr}",
            "--authorization-mode=Node,RBAC",
            f"--enable-admission-plugins={ADMISSION_PLUGINS}",
            # Webhooks and aggregated APIs are called at their Services' endpoints, as on a
            # cluster whose API server runs outside the pod network.
            "--enable-aggregator-routing=true",
            # The front proxy: how aggregated API servers learn who is asking.
            f"--proxy-client-cert-file={pki.cert(FRONT_PROXY_CLIENT.name)}",
            f"--proxy-client-key-file={pki.key(FRONT_PROXY_CLIENT.name)}",
            f"--requestheader-client-ca-file={pki.ca}",
            f"--requestheader-allowed-names={FRONT_PROXY_CLIENT.user}",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            "--allow-privileged=true",
            "--profiling=false",
            "--v=1",
        ),
    )


def controller_manager(layout: Layout, binaries: Path, pki: Pki) -> Component:
    return Component(
        "kube-controller-manager",
        (
            str(binaries / "kube-controller-manager"),
            *_control_plane_flags(pki, "controller-manager"),
            f"--service-account-private-key-file={pki.service_account_key}",
            f"--root-ca-file={pki.ca}",
            f"--cluster-signing-cert-file={pki.ca}",
            f"--cluster-signing-key-file={pki.ca_key}",
            f"--service-cluster-ip-range={layout.service_cidr}",
            "--use-service-account-credentials=true",
            "--controllers=*,bootstrapsigner,tokencleaner",
        ),
    )


def scheduler(binaries: Path, pki: Pki) -> Component:
    return Component(
        "kube-scheduler",
        (str(binaries / "kube-scheduler"), *_control_plane_flags(pki, "scheduler")),
    )


def _control_plane_flags(pki: Pki, name: str) -> tuple[str, ...]:
    """A controller's client identity (for the API server and for checking who calls its
    own endpoints, on loopback), one of it (no leader election), no profiling."""
    config = pki.kubeconfig(name)
    return (
        f"--kubeconfig={config}",
        f"--authentication-kubeconfig={config}",
        f"--authorization-kubeconfig={config}",
        "--bind-address=127.0.0.1",
        "--leader-elect=false",
        "--profiling=false",
    )


def containerd(layout: Layout) -> Component:
    return Component("containerd", (CONTAINERD, "--config", str(layout.state / "containerd.toml")))


def containerd_config(layout: Layout) -> str:
    """containerd's own root, state and socket (so a containerd of Docker's is left alone),
    its CRI plugin with the local pause image and the cluster's CNI configuration."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{layout.state / "containerd"}"
state = "{layout.run / "containerd"}"

[grpc]
  address = "{layout.containerd_socket}"

[ttrpc]
  address = "{layout.run / "containerd-ttrpc.sock"}"

[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  enable_selinux = false
  # Lowering a process's OOM score needs CAP_SYS_RESOURCE, which a sandboxed machine's
  # root may lack: pods then get the kubelet's scores, but none below containerd's own.
  restrict_oom_score_adj = true

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false

[{cri}.cni]
  bin_dir = "{CNI_BIN}"
  conf_dir = "{layout.state / "cni"}"
"""


def cni_config(layout: Layout) -> str:
    """One bridge for the pods, the host's end of it their gateway; no masquerading."""
    return json.dumps(
        {
            "cniVersion": "1.0.0",
            "name": "burstbuffer",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": layout.bridge,
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": layout.pod_subnet, "gateway": layout.node_ip}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(layout.state / "ipam"),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        },
        indent=2,
    )


def kubelet(layout: Layout, binaries: Path, pki: Pki) -> Component:
    return Component(
        "kubelet",
        (
            str(binaries / "kubelet"),
            f"--config={layout.state / 'kubelet.yaml'}",
            f"--kubeconfig={pki.kubeconfig('kubelet')}",
            f"--hostname-override={layout.node}",
            f"--node-ip={layout.node_ip}",
            f"--root-dir={layout.state / 'kubelet'}",
            "--v=1",
        ),
    )


def kubelet_config(layout: Layout, pki: Pki) -> str:
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": layout.node_ip,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(pki.ca)},
        },
        "authorization": {"mode": "Webhook"},
        "tlsCertFile": str(pki.cert("kubelet-serving")),
        "tlsPrivateKeyFile": str(pki.key("kubelet-serving")),
        # No systemd here: containerd's runc uses cgroupfs too.
        "cgroupDriver": "cgroupfs",
        "containerRuntimeEndpoint": f"unix://{layout.containerd_socket}",
        "clusterDNS": [layout.node_ip],
        "clusterDomain": layout.cluster_domain,
        "resolvConf": str(layout.state / "resolv.conf"),
        "failSwapOn": False,
        "serializeImagePulls": False,
        # A test machine's disk is shared with everything else on it: evict only when
        # it is really full, and never collect the images that cannot be pulled again.
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "shutdownGracePeriod": "0s",
        # Its own OOM score as containerd's pods get theirs (restrict_oom_score_adj).
        "oomScoreAdj": 0,
    }
    return yaml.safe_dump(config, sort_keys=False)


def kube_proxy(layout: Layout, binaries: Path, pki: Pki) -> Component:
    return Component(
        "kube-proxy",
        (
            str(binaries / "kube-proxy"),
            f"--kubeconfig={pki.kubeconfig('kube-proxy')}",
            f"--hostname-override={layout.node}",
            f"--cluster-cidr={layout.pod_cidr}",
            "--proxy-mode=iptables",
            f"--metrics-bind-address=127.0.0.1:{KUBE_PROXY_METRICS_PORT}",
            f"--healthz-bind-address=127.0.0.1:{KUBE_PROXY_HEALTHZ_PORT}",
            # Leave the machine's conntrack table size and OOM scores as they are.
            "--conntrack-max-per-core=0",
            "--oom-score-adj=0",
        ),
    )


def dns(layout: Layout, binaries: Path) -> Component:
    return Component("coredns", (str(binaries / "dns"), "-conf", str(layout.state / "Corefile")))


def corefile(layout: Layout, pki: Pki) -> str:
    """The cluster's Services and pods by name; other names are refused (pods reach
    nothing outside the machine anyway)."""
    return f""".:53 {{
    bind {layout.node_ip}
    errors
    ready 127.0.0.1:{DNS_READY_PORT}
    kubernetes {layout.cluster_domain} in-addr.arpa ip6.arpa {{
        kubeconfig {pki.kubeconfig("dns")} burstbuffer
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 30
    loadbalance
}}
"""
