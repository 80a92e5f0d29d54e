"""A one-node Kubernetes cluster on this machine: `up` starts it and leaves it running,
`down` stops it and removes every trace; `make cluster` and the cluster tests use both.

The order is local-up-cluster.sh's: the pod bridge, etcd, the API server, what the
cluster offers on top of it (addons.yaml), the controller manager and the scheduler,
containerd with the images imported, the kubelet (the node Ready), kube-proxy, the
cluster's DNS and the volume provisioner.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import ssl
import subprocess
import urllib.request
from collections.abc import Callable
from pathlib import Path
from string import Template

from tests.cluster import components
from tests.cluster.build import BuildUnavailable, bin_dir, build
from tests.cluster.images import APP_IMAGE, import_images
from tests.cluster.layout import Layout
from tests.cluster.pki import ADMIN, Pki, make_pki
from tests.cluster.processes import await_ready, start, stop, wait_until

LAYOUT = Layout()  # what `make cluster` runs
ADDONS = Path(__file__).resolve().parent / "addons.yaml"
FORWARD_COMMENT = "burstbuffer local cluster: pods to pods across the bridge"
# Debian's packages the node needs, by a program each installs.
NODE_PROGRAMS = {
    "/usr/bin/containerd": "containerd",
    "/usr/sbin/runc": "runc",
    "/usr/lib/cni/bridge": "containernetworking-plugins",
    "/usr/sbin/conntrack": "conntrack",
    "/usr/sbin/iptables": "iptables",
}
# What runs on the node, in the order it is started (stopped in reverse).
PROCESSES = (
    "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "containerd",
    "kubelet", "kube-proxy", "coredns", "local-path-provisioner",
)  # fmt: skip


class ClusterUnavailable(RuntimeError):
    """The cluster cannot run on this machine; the message says what is missing."""


def preflight() -> None:
    """Why this machine cannot run the cluster, if it cannot (as ClusterUnavailable)."""
    if os.geteuid() != 0:
        raise ClusterUnavailable("the cluster's kubelet, containerd and bridge need root")
    missing = [package for path, package in NODE_PROGRAMS.items() if not os.access(path, os.X_OK)]
    if missing:
        raise ClusterUnavailable(f"missing Debian packages: {' '.join(missing)}")
    if not Path("/proc/sys/net/bridge/bridge-nf-call-iptables").exists():
        raise ClusterUnavailable("the kernel has no br_netfilter (Services across the bridge)")


def kubectl(layout: Layout, *args: str, stdin: str | None = None, timeout: float = 60) -> str:
    """kubectl as the cluster's administrator; its output (an error names the command)."""
    done = subprocess.run(
        [str(layout.user_bin / "kubectl"), f"--kubeconfig={layout.kubeconfig}", *args],
        input=stdin, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def api_ready(layout: Layout) -> bool:
    """The API server answers /readyz to the administrator."""
    pki = Pki(layout.pki)
    try:
        context = ssl.create_default_context(cafile=str(pki.ca))
        context.load_cert_chain(str(pki.cert(ADMIN.name)), str(pki.key(ADMIN.name)))
        with urllib.request.urlopen(f"{layout.server}/readyz", context=context, timeout=5) as r:
            return bool(r.status == 200)
    except (OSError, ssl.SSLError):
        return False


def up(layout: Layout = LAYOUT, say: Callable[[str], None] = print) -> None:
    """Start the cluster (building what is missing), or leave it be if it runs."""
    preflight()
    if api_ready(layout):
        say(f"the cluster is running: KUBECONFIG={layout.kubeconfig}")
        return
    down(layout)  # what a cluster that was not stopped left behind
    say("building the cluster's binaries (the first time takes about 25 minutes)")
    layout.logs.mkdir(parents=True, exist_ok=True)
    try:
        binaries = build(layout.logs / "build.log")
    except BuildUnavailable as e:
        raise ClusterUnavailable(str(e)) from e
    pki = make_pki(layout.pki, layout.node, layout.node_ip, layout.service_ip, layout.server)
    _user_files(layout, binaries, pki)
    _network(layout)
    _configuration(layout, pki)

    start(layout, components.etcd(layout, binaries))
    await_ready(layout, "etcd", lambda: _etcd_healthy(layout), "healthy")
    start(layout, components.apiserver(layout, binaries, pki))
    await_ready(layout, "kube-apiserver", lambda: api_ready(layout), "ready", timeout=180)
    addons = Template(ADDONS.read_text()).safe_substitute(
        VOLUMES=str(layout.volumes), HELPER_IMAGE=APP_IMAGE
    )
    kubectl(layout, "apply", "--server-side", "-f", "-", stdin=addons)
    start(layout, components.controller_manager(layout, binaries, pki))
    start(layout, components.scheduler(binaries, pki))

    start(layout, components.containerd(layout))
    await_ready(layout, "containerd", layout.containerd_socket.exists, "listening")
    say("importing the images into containerd (the first time builds them: minutes)")
    for name in import_images(layout):
        say(f"  {name}")
    start(layout, components.kubelet(layout, binaries, pki))
    await_ready(layout, "kubelet", lambda: _node_ready(layout), "Ready", timeout=180)
    start(layout, components.kube_proxy(layout, binaries, pki))
    start(layout, components.dns(layout, binaries))
    await_ready(layout, "coredns", lambda: _dns_ready(), "ready")
    start(layout, _storage(layout, binaries, pki))
    # Pods can be made in a namespace once its default ServiceAccount exists.
    wait_until(lambda: bool(kubectl(layout, "get", "serviceaccounts", "-o", "name")), 60)
    say(usage(layout))


def usage(layout: Layout) -> str:
    return f"""
The cluster is running (one node, {layout.node}). To use it:

  export KUBECONFIG={layout.kubeconfig} PATH={layout.user_bin}:$PATH
  kubectl get nodes
  helm install burstbuffer charts/burstbuffer --namespace burstbuffer --create-namespace --wait

Its images: the chart's defaults and {APP_IMAGE} (wget, curl, Python 3) for app pods.
Logs: {layout.logs}. Stop it and remove everything: make cluster-down
"""


def down(layout: Layout = LAYOUT) -> None:
    """Stop every process of the cluster and its pods, and remove its state and network."""
    for name in PROCESSES[:0:-1]:
        if name == "containerd":
            _kill_pods()
        stop(layout, name)
    _cleanup_proxy_rules()
    stop(layout, PROCESSES[0])
    _unmount_below(layout.home, layout.run)
    _remove_network(layout)
    shutil.rmtree(layout.run, ignore_errors=True)
    shutil.rmtree(layout.home, ignore_errors=True)


def _user_files(layout: Layout, binaries: Path, pki: Pki) -> None:
    layout.user_bin.mkdir(parents=True, exist_ok=True)
    for program in ("kubectl", "helm"):
        link = layout.user_bin / program
        link.unlink(missing_ok=True)
        link.symlink_to(binaries / program)
    shutil.copy(pki.kubeconfig(ADMIN.name), layout.kubeconfig)
    layout.kubeconfig.chmod(0o600)


def _network(layout: Layout) -> None:
    """The pods' bridge with the node's address on it; bridged traffic goes through
    iptables (kube-proxy's Service rules) and is let through the FORWARD chain, which
    Docker's daemon may have set to DROP."""
    ip = ["ip", "link", "add", layout.bridge, "type", "bridge"]
    subprocess.run(ip, check=True, timeout=30)
    subprocess.run(["ip", "addr", "add", f"{layout.node_ip}/24", "dev", layout.bridge],
                   check=True, timeout=30)  # fmt: skip
    subprocess.run(["ip", "link", "set", layout.bridge, "up"], check=True, timeout=30)
    Path("/proc/sys/net/bridge/bridge-nf-call-iptables").write_text("1\n")
    rule = ["iptables", "-I", "FORWARD", "1", *_forward_rule(layout)]
    subprocess.run(rule, check=True, timeout=30)


def _forward_rule(layout: Layout) -> list[str]:
    return ["-i", layout.bridge, "-o", layout.bridge, "-m", "comment",
            "--comment", FORWARD_COMMENT, "-j", "ACCEPT"]  # fmt: skip


def _configuration(layout: Layout, pki: Pki) -> None:
    (layout.state / "cni").mkdir(parents=True, exist_ok=True)
    (layout.state / "cni" / "10-burstbuffer.conflist").write_text(components.cni_config(layout))
    (layout.state / "containerd.toml").write_text(components.containerd_config(layout))
    (layout.state / "kubelet.yaml").write_text(components.kubelet_config(layout, pki))
    (layout.state / "resolv.conf").write_text(f"nameserver {layout.node_ip}\n")
    (layout.state / "Corefile").write_text(components.corefile(layout, pki))
    layout.volumes.mkdir(parents=True, exist_ok=True)
    layout.run.mkdir(parents=True, exist_ok=True)


def _storage(layout: Layout, binaries: Path, pki: Pki) -> components.Component:
    return components.Component(
        "local-path-provisioner",
        (
            str(binaries / "local-path-provisioner"),
            "start",
            f"--kubeconfig={pki.kubeconfig('storage')}",
            "--namespace=local-path-storage",
            "--service-account-name=local-path-provisioner-service-account",
            f"--helper-image={APP_IMAGE}",
        ),
    )


def _etcd_healthy(layout: Layout) -> bool:
    try:
        url = f"http://127.0.0.1:{layout.etcd_client_port}/health"
        with urllib.request.urlopen(url, timeout=5) as response:
            return bool(json.load(response).get("health") == "true")
    except (OSError, ValueError):
        return False


def _node_ready(layout: Layout) -> bool:
    try:
        node = json.loads(kubectl(layout, "get", "node", layout.node, "-o", "json"))
    except RuntimeError:
        return False
    conditions = {c["type"]: c["status"] for c in node["status"].get("conditions", [])}
    return conditions.get("Ready") == "True"


def _dns_ready() -> bool:
    try:
        url = f"http://127.0.0.1:{components.DNS_READY_PORT}/ready"
        with urllib.request.urlopen(url, timeout=5) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _kill_pods() -> None:
    """Every process the kubelet's pods left (their cgroups are the kubelet's kubepods)."""
    for tree in Path("/sys/fs/cgroup").glob("*/kubepods"):
        for procs in tree.rglob("cgroup.procs"):
            for pid in procs.read_text().split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
    for tree in Path("/sys/fs/cgroup").glob("*/kubepods"):
        # Deepest first: a cgroup is removed once it has no children and no processes.
        folders = sorted((p for p in tree.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
        for folder in folders:
            wait_until(lambda folder=folder: _rmdir(folder), 10, 0.1)
        _rmdir(tree)


def _rmdir(folder: Path) -> bool:
    try:
        folder.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def _cleanup_proxy_rules() -> None:
    """kube-proxy's own removal of its iptables chains and rules."""
    kube_proxy = bin_dir() / "kube-proxy"
    if os.access(kube_proxy, os.X_OK):
        subprocess.run([kube_proxy, "--cleanup"], capture_output=True, timeout=60)


def _unmount_below(*folders: Path) -> None:
    """Unmount what the kubelet and containerd mounted (volumes, rootfs, netns), deepest first."""
    prefixes = tuple(f"{folder}/" for folder in folders)
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point.startswith(prefixes):
            mounts.append(point)
    for point in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, timeout=30)
    for netns in Path("/var/run/netns").glob("cni-*"):
        subprocess.run(["umount", "-l", str(netns)], capture_output=True, timeout=30)
        netns.unlink(missing_ok=True)


def _remove_network(layout: Layout) -> None:
    subprocess.run(["ip", "link", "delete", layout.bridge], capture_output=True, timeout=30)
    while (
        subprocess.run(
            ["iptables", "-D", "FORWARD", *_forward_rule(layout)], capture_output=True, timeout=30
        ).returncode
        == 0  # fmt: skip
    ):
        pass
