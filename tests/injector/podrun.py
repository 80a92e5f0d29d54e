"""Run an injected pod on this machine the way the kubelet would: the pod-run harness.

It reads the pod (the output of `burstbuffer-injector render`) and does what the pod
says, nothing it does not say:

- the pod gets a fresh network namespace with loopback and one address (the pod IP);
- each emptyDir is a directory (mode 0777, as the kubelet makes it);
- init containers run in order; one with `restartPolicy: Always` (a native sidecar) is
  started and the next one waits for its startupProbe, run against the pod IP; regular
  containers then start in order, each after its postStart hook returned;
- each container is a process in its own mount and PID namespaces, chrooted into an
  overlay of its image's root file system, with exactly its volumeMounts (subPath files
  bind-mounted over the paths named, read-only where it says so), its securityContext
  (user, group, read-only root, no new privileges, dropped capabilities), and exactly
  its env, with `$(VAR)` references and downward-API fields resolved as the kubelet does.

What the harness supplies because a container runtime, the kubelet or the API server
would, not the pod: the images (see `Image`), the ConfigMaps that configMap volumes name
(`config_maps`), the runtime's variables (image PATH, HOSTNAME, HOME=/ and the
`kubernetes` service variables), /etc/hosts with the pod's hostAliases, /etc/hostname,
/etc/resolv.conf (the cluster's DNS, or the pod's dnsConfig), the pod's namespaced
sysctls, /proc and a minimal /dev. Nothing else: the pod alone says what runs.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shlex
import signal
import subprocess
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.harness import http_get
from bench.netns import create_netns, delete_netns, in_netns
from tests.registries import apt_proxy, debian_archive, package_manager_env

POD_IP = "10.88.0.2"
SERVICE_ENV = {
    # What the kubelet gives every container for the `kubernetes` service.
    "KUBERNETES_SERVICE_HOST": "10.96.0.1",
    "KUBERNETES_SERVICE_PORT": "443",
    "KUBERNETES_SERVICE_PORT_HTTPS": "443",
    "KUBERNETES_PORT": "tcp://10.96.0.1:443",
    "KUBERNETES_PORT_443_TCP": "tcp://10.96.0.1:443",
    "KUBERNETES_PORT_443_TCP_PROTO": "tcp",
    "KUBERNETES_PORT_443_TCP_PORT": "443",
    "KUBERNETES_PORT_443_TCP_ADDR": "10.96.0.1",
}
DEBIAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The clients the app image offers: wget, curl, Python's urllib, requests and pip.
DEBIAN_PACKAGES = ("wget", "curl", "python3", "python3-requests", "python3-pip", "ca-certificates")
# What the kubelet writes for dnsPolicy ClusterFirst; no cluster DNS answers there, so
# lookups fail fast, as off-cluster.
CLUSTER_DNS = {
    "nameservers": ["10.96.0.10"],
    "searches": ["default.svc.cluster.local", "svc.cluster.local", "cluster.local"],
    "options": [{"name": "ndots", "value": "5"}],
}
STOP_GRACE = 10.0

_REFERENCE = re.compile(r"\$(\$|\(([A-Za-z_][A-Za-z0-9_.-]*)\))")


class PodFailed(RuntimeError):
    """A container of the pod failed to start, failed its probe, or an init container failed."""


@dataclass(frozen=True)
class Image:
    """What a container image provides: a root file system, ENV, USER, WORKDIR."""

    root: Path
    env: Mapping[str, str]
    user: int = 0
    workdir: str = "/"
    # Directories opened for traversal in this image (chmod 0711 in the container's
    # overlay): the host-root image needs /root to reach the venv's interpreter.
    traverse: tuple[str, ...] = ()


def expand(text: str, variables: Mapping[str, str]) -> str:
    """The kubelet's `$(VAR)` expansion: `$$` is `$`, unknown references stay as written."""

    def replace(match: re.Match[str]) -> str:
        if match.group(1) == "$":
            return "$"
        return variables.get(match.group(2), match.group(0))

    return _REFERENCE.sub(replace, text)


def debian_rootfs(
    cache: Path, suite: str = "bookworm", packages: tuple[str, ...] = DEBIAN_PACKAGES
) -> Path:
    """A Debian root of `suite` with `packages`: made once (per package list), under a lock."""
    key = hashlib.sha256(",".join(packages).encode()).hexdigest()[:12]
    root = cache / f"rootfs-{suite}-{key}"
    if root.is_dir():
        return root
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f"rootfs-{suite}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not root.is_dir():
            partial = cache / f"rootfs-{suite}-{key}.tmp"
            subprocess.run(["rm", "-rf", str(partial)], check=True)
            # From the archive this machine's apt uses, through its proxy if it has one.
            subprocess.run(
                [
                    "debootstrap",
                    "--variant=minbase",
                    f"--include={','.join(packages)}",
                    suite,
                    str(partial),
                    debian_archive(),
                ],
                env=package_manager_env(**apt_proxy()),
                check=True,
                capture_output=True,
                timeout=900,
            )
            partial.rename(root)
    return root


@dataclass
class Running:
    """One started container."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path
    env: dict[str, str]
    user: tuple[int, int]

    def inner_pid(self) -> int | None:
        # `unshare --fork`: the container's PID 1 is unshare's only child.
        try:
            children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
            pids = children.read_text().split()
        except OSError:
            return None
        return int(pids[0]) if pids else None


@dataclass
class PodRun:
    """A pod spec, run on this machine. Use as a context manager."""

    pod: dict[str, Any]
    images: Mapping[str, Image]
    workdir: Path
    # The ConfigMaps of the pod's namespace: {name: {key: text}}.
    config_maps: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    pod_ip: str = POD_IP
    netns: str = field(default_factory=lambda: f"bbpod-{uuid.uuid4().hex[:10]}")
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    running: dict[str, Running] = field(default_factory=dict)
    _runs: int = 0

    # -- the pod ---------------------------------------------------------------------

    @property
    def spec(self) -> dict[str, Any]:
        return self.pod["spec"]

    @property
    def name(self) -> str:
        metadata = self.pod.get("metadata", {})
        return str(metadata.get("name") or metadata.get("generateName", "pod-") + "abcde")

    def __enter__(self) -> PodRun:
        self._create_netns()
        try:
            self._write_pod_files()
            for volume in self.spec.get("volumes") or []:
                self._make_volume(volume)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def volume_dir(self, name: str) -> Path:
        return self.workdir / "volumes" / name

    def _make_volume(self, volume: dict[str, Any]) -> None:
        directory = self.volume_dir(volume["name"])
        directory.mkdir(parents=True)
        if "emptyDir" in volume:
            directory.chmod(0o777)
            return
        if "configMap" not in volume:
            raise PodFailed(f"volume {volume['name']}: only emptyDir and configMap are supported")
        source = volume["configMap"]
        data = self.config_maps.get(source["name"])
        if data is None:
            # The kubelet keeps such a pod in ContainerCreating; here it fails at once.
            raise PodFailed(f"volume {volume['name']}: no ConfigMap {source['name']}")
        items = source.get("items") or [{"key": k, "path": k} for k in data]
        for item in items:
            target = directory / item["path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(data[item["key"]])
            target.chmod(item.get("mode", source.get("defaultMode", 0o644)))
        directory.chmod(0o755)

    def _create_netns(self) -> None:
        # The pod IP on loopback: there is no node outside to reach it from. The pod's
        # sysctls: the runtime sets them in the sandbox before any container.
        sysctls = (self.spec.get("securityContext") or {}).get("sysctls") or []
        for sysctl in sysctls:
            if not sysctl["name"].startswith("net."):
                raise PodFailed(f"sysctl {sysctl['name']}: only net.* is namespaced here")
        settings = {sysctl["name"]: str(sysctl["value"]) for sysctl in sysctls}
        create_netns(self.netns, addresses=[self.pod_ip], sysctls=settings)

    def _write_pod_files(self) -> None:
        etc = self.workdir / "etc"
        etc.mkdir(parents=True)
        hostname = self.spec.get("hostname") or self.name
        hosts = [
            "# Kubernetes-managed hosts file.",
            "127.0.0.1\tlocalhost",
            "::1\tlocalhost ip6-localhost ip6-loopback",
            f"{self.pod_ip}\t{hostname}",
        ]
        aliases = self.spec.get("hostAliases") or []
        if aliases:
            hosts.append("# Entries added by HostAliases.")
            hosts += [f"{a['ip']}\t{' '.join(a['hostnames'])}" for a in aliases]
        (etc / "hosts").write_text("\n".join(hosts) + "\n")
        (etc / "hostname").write_text(hostname + "\n")
        (etc / "resolv.conf").write_text(self._resolv_conf())
        for path in etc.iterdir():
            path.chmod(0o644)

    def _resolv_conf(self) -> str:
        """The kubelet's resolv.conf: the cluster's DNS (unless dnsPolicy None) + dnsConfig."""
        own = self.spec.get("dnsConfig") or {}
        base = {} if self.spec.get("dnsPolicy") == "None" else CLUSTER_DNS
        keys = ("nameservers", "searches", "options")
        nameservers, searches, options = ([*base.get(k, []), *own.get(k, [])] for k in keys)
        lines = [f"nameserver {n}" for n in nameservers]
        if searches:
            lines.insert(0, "search " + " ".join(searches))
        if options:
            spelled = (o["name"] + (f":{o['value']}" if "value" in o else "") for o in options)
            lines.append("options " + " ".join(spelled))
        return "\n".join(lines) + "\n"

    # -- starting and stopping ---------------------------------------------------------

    def start(self, timeout: float = 180.0) -> None:
        """Run the init containers and start the regular ones, as the kubelet does."""
        deadline = time.monotonic() + timeout
        for container in self.spec.get("initContainers") or []:
            running = self._start(container)
            if container.get("restartPolicy") == "Always":
                self._await_startup(container, running, deadline)
            else:
                code = self._wait(running, deadline - time.monotonic())
                if code != 0:
                    raise PodFailed(
                        f"init container {container['name']} exited {code}: "
                        f"{running.log.read_text(errors='replace')[-3000:]}"
                    )
        for container in self.spec["containers"]:
            running = self._start(container)
            self._post_start(container, running, deadline)
            if "startupProbe" in container:
                self._await_startup(container, running, deadline)

    def wait(self, name: str, timeout: float = 120.0) -> int:
        """The exit code of a container that runs to completion."""
        return self._wait(self.running[name], timeout)

    def log(self, name: str) -> str:
        return self.running[name].log.read_text(errors="replace")

    def restart(self, name: str, timeout: float = 120.0) -> None:
        """Kill a container and start it again (the kubelet's restart), then await its probe."""
        container = self._container(name)
        self._stop(self.running.pop(name))
        running = self._start(container)
        self._await_startup(container, running, time.monotonic() + timeout)

    def stop(self) -> None:
        for running in reversed(list(self.running.values())):
            self._stop(running)
        delete_netns(self.netns)

    def _stop(self, running: Running) -> None:
        if running.process.poll() is not None:
            return
        inner = running.inner_pid()
        if inner is not None:
            try:
                os.kill(inner, signal.SIGTERM)
            except ProcessLookupError:
                pass
        try:
            running.process.wait(STOP_GRACE)
        except subprocess.TimeoutExpired:
            inner = running.inner_pid()
            if inner is not None:
                os.kill(inner, signal.SIGKILL)  # PID 1 of its namespace: ends all of it
            running.process.kill()
            running.process.wait(10)

    def _wait(self, running: Running, timeout: float) -> int:
        try:
            return running.process.wait(max(timeout, 0.1))
        except subprocess.TimeoutExpired:
            raise PodFailed(
                f"container {running.name} still runs after {timeout:.0f}s: "
                f"{running.log.read_text(errors='replace')[-3000:]}"
            ) from None

    def _container(self, name: str) -> dict[str, Any]:
        for container in (self.spec.get("initContainers") or []) + self.spec["containers"]:
            if container["name"] == name:
                return container
        raise KeyError(name)

    # -- probes and hooks --------------------------------------------------------------

    def _await_startup(self, container: dict[str, Any], running: Running, deadline: float) -> None:
        probe = container.get("startupProbe")
        if probe is None:
            return
        if "httpGet" not in probe:
            raise PodFailed(f"container {container['name']}: only httpGet probes are supported")
        get = probe["httpGet"]
        port = get["port"]
        if isinstance(port, str):
            port = next(p["containerPort"] for p in container["ports"] if p.get("name") == port)
        url = f"http://{get.get('host', self.pod_ip)}:{port}{get.get('path', '/')}"
        period = probe.get("periodSeconds", 10)
        failures_allowed = probe.get("failureThreshold", 3)
        time.sleep(probe.get("initialDelaySeconds", 0))
        for _ in range(failures_allowed):
            if running.process.poll() is not None:
                raise PodFailed(
                    f"container {container['name']} exited {running.process.returncode} "
                    f"before its startup probe passed: "
                    f"{running.log.read_text(errors='replace')[-3000:]}"
                )
            try:
                status, _ = self.get(url, timeout=probe.get("timeoutSeconds", 1))
                if 200 <= status < 400:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                break
            time.sleep(period)
        raise PodFailed(
            f"container {container['name']}: startup probe {url} failed: "
            f"{running.log.read_text(errors='replace')[-3000:]}"
        )

    def _post_start(self, container: dict[str, Any], running: Running, deadline: float) -> None:
        hook = (container.get("lifecycle") or {}).get("postStart")
        if hook is None:
            return
        if "exec" not in hook:
            raise PodFailed(f"container {container['name']}: only exec hooks are supported")
        # No $(VAR) expansion in hook commands, as in the kubelet.
        done = self.exec(container["name"], hook["exec"]["command"], deadline - time.monotonic())
        if done.returncode != 0:
            raise PodFailed(
                f"container {container['name']}: postStart hook exited {done.returncode}: "
                f"{done.stdout.decode(errors='replace')[-2000:]}"
            )

    def exec(
        self, name: str, argv: list[str], timeout: float = 120.0
    ) -> subprocess.CompletedProcess[bytes]:
        """Run `argv` in a running container (`kubectl exec`): its namespaces, root, user, env."""
        running = self.running[name]
        deadline = time.monotonic() + timeout
        inner = running.inner_pid()
        while inner is None and running.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
            inner = running.inner_pid()
        if inner is None:
            raise PodFailed(f"container {name} is not running")
        uid, gid = running.user
        command = ["nsenter", "-t", str(inner), "-m", "-p", "-n", "-r", "-w"]
        command += ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]
        command += ["env", "-i", *(f"{k}={v}" for k, v in running.env.items()), *argv]
        return subprocess.run(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=max(deadline - time.monotonic(), 1),
        )

    def get(self, url: str, timeout: float = 5.0, cafile: Path | None = None) -> tuple[int, bytes]:
        """GET a URL from inside the pod's network namespace (no proxy)."""
        return in_netns(self.netns, lambda: http_get(url, timeout, cafile))  # type: ignore[no-any-return]

    def stats(self, port: int) -> dict[str, Any]:
        status, body = self.get(f"http://{self.pod_ip}:{port}/stats")
        assert status == 200, body
        return json.loads(body)  # type: ignore[no-any-return]

    # -- one container -----------------------------------------------------------------

    def _field(self, path: str) -> str:
        metadata = self.pod.get("metadata", {})
        values = {
            "metadata.name": self.name,
            "metadata.namespace": metadata.get("namespace", "default"),
            "metadata.uid": self.uid,
            "status.podIP": self.pod_ip,
            "spec.nodeName": "node-1",
            "spec.serviceAccountName": self.spec.get("serviceAccountName", "default"),
        }
        if path not in values:
            raise PodFailed(f"fieldRef {path} is not supported here")
        return values[path]

    def _env(self, container: dict[str, Any], image: Image) -> dict[str, str]:
        if container.get("envFrom"):
            raise PodFailed(f"container {container['name']}: envFrom is not supported here")
        defined: dict[str, str] = dict(SERVICE_ENV)
        for entry in container.get("env") or []:
            if "valueFrom" in entry:
                source = entry["valueFrom"]
                if "fieldRef" not in source:
                    raise PodFailed(f"env {entry['name']}: only fieldRef is supported here")
                value = self._field(source["fieldRef"]["fieldPath"])
            else:
                value = expand(entry.get("value", ""), defined)
            defined[entry["name"]] = value
        # The runtime's order: image ENV, then HOSTNAME and HOME, then the kubelet's list.
        hostname = self.spec.get("hostname") or self.name
        return {**image.env, "HOSTNAME": hostname, "HOME": "/", **defined}

    def _argv(self, container: dict[str, Any], env: Mapping[str, str]) -> list[str]:
        command = [expand(a, env) for a in container.get("command") or []]
        args = [expand(a, env) for a in container.get("args") or []]
        if not command:
            raise PodFailed(f"container {container['name']}: the test images have no ENTRYPOINT")
        return [*command, *args]

    def _user(self, container: dict[str, Any], image: Image) -> tuple[int, int]:
        pod_context = self.spec.get("securityContext") or {}
        context = container.get("securityContext") or {}
        uid = context.get("runAsUser", pod_context.get("runAsUser", image.user))
        gid = context.get("runAsGroup", pod_context.get("runAsGroup", uid))
        if context.get("runAsNonRoot", pod_context.get("runAsNonRoot")) and uid == 0:
            raise PodFailed(f"container {container['name']}: runAsNonRoot with UID 0")
        return uid, gid

    def _mount_lines(self, container: dict[str, Any], root: str) -> list[str]:
        volumes = {v["name"]: v for v in self.spec.get("volumes") or []}
        lines = []
        mounts = sorted(
            container.get("volumeMounts") or [], key=lambda m: m["mountPath"].count("/")
        )
        for mount in mounts:
            if mount["name"] not in volumes:
                raise PodFailed(f"container {container['name']}: no volume {mount['name']}")
            source = self.volume_dir(mount["name"])
            if mount.get("subPath"):
                source = source / mount["subPath"]
                if not source.exists():
                    # What the kubelet does for a missing subPath: it makes a directory.
                    source.mkdir(parents=True)
            target = shlex.quote(root + mount["mountPath"])
            if source.is_dir():
                lines.append(f"mkdir -p {target}")
            else:
                lines.append(
                    f'mkdir -p "$(dirname {target})" && {{ [ -e {target} ] || touch {target}; }}'
                )
            lines.append(f"mount --bind {shlex.quote(str(source))} {target}")
            # The kubelet always mounts a configMap volume read-only.
            if mount.get("readOnly") or "configMap" in volumes[mount["name"]]:
                lines.append(f"mount -o remount,bind,ro {target}")
        return lines

    def _script(
        self,
        container: dict[str, Any],
        image: Image,
        env: Mapping[str, str],
        argv: list[str],
        user: tuple[int, int],
        scratch: Path,
    ) -> str:
        context = container.get("securityContext") or {}
        root = str(scratch / "root")
        etc = self.workdir / "etc"
        q = shlex.quote
        lines = [
            "set -eu",
            # Upper layer on a tmpfs: an overlay's upper may not lie inside its lower (/).
            f"mount -t tmpfs -o mode=755 tmpfs {q(str(scratch))}",
            f"mkdir -p {q(str(scratch))}/upper {q(str(scratch))}/work {q(root)}",
            f"mount -t overlay overlay -o lowerdir={q(str(image.root))},"
            f"upperdir={q(str(scratch))}/upper,workdir={q(str(scratch))}/work {q(root)}",
            *(f"chmod 0711 {q(root + d)}" for d in image.traverse),
            f"mkdir -p {q(root)}/proc {q(root)}/dev {q(root)}/etc",
            f"mount -t proc proc {q(root)}/proc",
            f"mount -t tmpfs -o mode=755,nosuid tmpfs {q(root)}/dev",
        ]
        for device in ("null", "zero", "full", "random", "urandom", "tty"):
            lines.append(f"touch {q(root)}/dev/{device}")
            lines.append(f"mount --bind /dev/{device} {q(root)}/dev/{device}")
        lines.append(
            f"mkdir -p {q(root)}/dev/shm && mount -t tmpfs -o mode=1777 tmpfs {q(root)}/dev/shm"
        )
        for name in ("hosts", "hostname", "resolv.conf"):
            lines.append(f"touch {q(root)}/etc/{name}")
            lines.append(f"mount --bind {q(str(etc / name))} {q(root)}/etc/{name}")
        lines += self._mount_lines(container, root)
        if context.get("readOnlyRootFilesystem"):
            lines.append(f"mount -o remount,ro {q(root)}")
        uid, gid = user
        privileges = [f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]
        if context.get("allowPrivilegeEscalation") is False:
            privileges.append("--no-new-privs")
        capabilities = context.get("capabilities") or {}
        if "ALL" in (capabilities.get("drop") or []):
            # What is left: the added capabilities (root gets its bounding set on exec).
            kept = "".join(f",+{c.lower()}" for c in capabilities.get("add") or [])
            privileges += [f"--inh-caps=-all{kept}", f"--bounding-set=-all{kept}"]
        workdir = container.get("workingDir") or image.workdir
        variables = [f"{k}={v}" for k, v in env.items()]
        final = [
            "chroot",
            root,
            "setpriv",
            *privileges,
            "env",
            "-i",
            "-C",
            workdir,
            *variables,
            *argv,
        ]
        lines.append("exec " + " ".join(q(a) for a in final))
        return "\n".join(lines)

    def _start(self, container: dict[str, Any]) -> Running:
        image = self.images.get(container["image"])
        if image is None:
            raise PodFailed(f"container {container['name']}: no image {container['image']}")
        env = self._env(container, image)
        argv = self._argv(container, env)
        user = self._user(container, image)
        self._runs += 1
        scratch = self.workdir / "containers" / f"{container['name']}.{self._runs}"
        scratch.mkdir(parents=True)
        script = self._script(container, image, env, argv, user, scratch)
        (scratch.parent / f"{container['name']}.{self._runs}.sh").write_text(script)
        log = self.workdir / "logs" / f"{container['name']}.{self._runs}.log"
        log.parent.mkdir(exist_ok=True)
        with open(log, "wb") as output:
            process = subprocess.Popen(
                ["ip", "netns", "exec", self.netns,
                 "unshare", "--mount", "--pid", "--fork", "--propagation", "private",
                 "sh", "-c", script],
                stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
            )  # fmt: skip
        running = Running(container["name"], process, log, env, user)
        self.running[container["name"]] = running
        self._await_root(running)
        return running

    def _await_root(self, running: Running, timeout: float = 30.0) -> None:
        """Wait until the container is in its own root (its mounts are then final)."""
        host_root = os.stat("/")
        deadline = time.monotonic() + timeout
        while running.process.poll() is None and time.monotonic() < deadline:
            inner = running.inner_pid()
            try:
                root = os.stat(f"/proc/{inner}/root") if inner is not None else host_root
            except OSError:
                root = host_root
            if (root.st_dev, root.st_ino) != (host_root.st_dev, host_root.st_ino):
                return
            time.sleep(0.02)
        if running.process.poll() is None:
            raise PodFailed(f"container {running.name} did not start: {running.log.read_text()}")
