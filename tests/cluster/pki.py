"""The cluster's certificates and kubeconfigs, made with trustme as kubeadm would lay them out.

One CA signs everything: the API server's serving certificate (its Service IP, the node's
address, the `kubernetes.default` names), the kubelet's, and a client certificate per
component whose subject is the identity RBAC and the Node authorizer know it by. The
service-account tokens are signed by a key of their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import trustme
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec


@dataclass(frozen=True)
class Identity:
    """A client of the API server: its file name, user name and groups."""

    name: str
    user: str
    group: str | None = None


# Who talks to the API server, with the subjects RBAC's default roles are bound to.
ADMIN = Identity("admin", "kubernetes-admin", "system:masters")
CLIENTS = (
    ADMIN,
    Identity("controller-manager", "system:kube-controller-manager"),
    Identity("scheduler", "system:kube-scheduler"),
    Identity("kube-proxy", "system:kube-proxy"),
    Identity("dns", "system:coredns"),
    Identity("storage", "system:local-path-provisioner"),
)
# The API server's client certificate towards kubelets (logs, exec, port-forward).
KUBELET_CLIENT = Identity(
    "apiserver-kubelet-client", "kube-apiserver-kubelet-client", "system:masters"
)
# The API server's client certificate towards aggregated API servers (the front proxy).
FRONT_PROXY_CLIENT = Identity("front-proxy-client", "front-proxy-client")


def kubelet_identity(node: str) -> Identity:
    """The Node authorizer knows a kubelet only by this user and group."""
    return Identity("kubelet", f"system:node:{node}", "system:nodes")


@dataclass(frozen=True)
class Pki:
    """Paths of what `make_pki` wrote."""

    folder: Path

    @property
    def ca(self) -> Path:
        return self.folder / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.folder / "ca.key"

    @property
    def service_account_key(self) -> Path:
        return self.folder / "sa.key"

    @property
    def service_account_public(self) -> Path:
        return self.folder / "sa.pub"

    def cert(self, name: str) -> Path:
        return self.folder / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.folder / f"{name}.key"

    def kubeconfig(self, name: str) -> Path:
        return self.folder / f"{name}.kubeconfig"


def make_pki(folder: Path, node: str, node_ip: str, service_ip: str, server: str) -> Pki:
    """Every certificate, key and kubeconfig of the cluster, written into `folder` (0700)."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    pki = Pki(folder)
    ca = trustme.CA(organization_name="burstbuffer local cluster")
    ca.cert_pem.write_to_path(str(pki.ca))
    ca.private_key_pem.write_to_path(str(pki.ca_key))
    _write_key(pki.ca_key)

    names = ("kubernetes", "kubernetes.default", "kubernetes.default.svc",
             "kubernetes.default.svc.cluster.local", "localhost")  # fmt: skip
    _issue(ca, pki, "apiserver", (*names, node_ip, service_ip, "127.0.0.1"), "kube-apiserver")
    _issue(ca, pki, "kubelet-serving", (node, node_ip, "127.0.0.1"), f"system:node:{node}")
    for identity in (*CLIENTS, KUBELET_CLIENT, FRONT_PROXY_CLIENT, kubelet_identity(node)):
        _issue(ca, pki, identity.name, (identity.name,), identity.user, identity.group)
        if identity not in (KUBELET_CLIENT, FRONT_PROXY_CLIENT):
            write_kubeconfig(pki, identity.name, server)

    account_key = ec.generate_private_key(ec.SECP256R1())
    pki.service_account_key.write_bytes(
        account_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    _write_key(pki.service_account_key)
    pki.service_account_public.write_bytes(
        account_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pki


def write_kubeconfig(pki: Pki, name: str, server: str, path: Path | None = None) -> Path:
    """A kubeconfig for `name`'s client certificate (absolute paths, so it can be copied)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "burstbuffer",
                "cluster": {"server": server, "certificate-authority": str(pki.ca)},
            }
        ],
        "users": [
            {
                "name": name,
                "user": {
                    "client-certificate": str(pki.cert(name)),
                    "client-key": str(pki.key(name)),
                },
            }
        ],
        "contexts": [{"name": "burstbuffer", "context": {"cluster": "burstbuffer", "user": name}}],
        "current-context": "burstbuffer",
    }
    target = path or pki.kubeconfig(name)
    target.write_text(yaml.safe_dump(config, sort_keys=False))
    target.chmod(0o600)
    return target


def _issue(
    ca: trustme.CA,
    pki: Pki,
    name: str,
    identities: tuple[str, ...],
    common_name: str,
    group: str | None = None,
) -> None:
    leaf = ca.issue_cert(*identities, common_name=common_name, organization_name=group)
    leaf.cert_chain_pems[0].write_to_path(str(pki.cert(name)))
    leaf.private_key_pem.write_to_path(str(pki.key(name)))
    _write_key(pki.key(name))


def _write_key(path: Path) -> None:
    path.chmod(0o600)
