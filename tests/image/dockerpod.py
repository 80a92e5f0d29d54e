"""Run an injected pod as Docker containers, the way a kubelet with Docker as its runtime did.

The pod is the output of `burstbuffer-injector render`; each container is started with
exactly what its spec says, translated flag by flag:

- the pod's sandbox is a container of its own that holds the network namespace (as
  Kubernetes' pause container does); every container of the pod joins it with
  `--network container:SANDBOX`, so they share loopback and the pod IP;
- user and group (`--user`), `readOnlyRootFilesystem` (`--read-only`), dropped and added
  capabilities (`--cap-drop`/`--cap-add`), `allowPrivilegeEscalation: false`
  (`no-new-privileges`), the memory and CPU limits; `RuntimeDefault` seccomp is Docker's
  default profile;
- an emptyDir is a Docker volume, a tmpfs of `sizeLimit` for medium Memory, mode 0777
  (as the kubelet makes it); a persistentVolumeClaim is a new, empty Docker volume
  (root's, 0755) that the pod's `fsGroup` is given as the kubelet gives it (group
  owner, setgid, group-writable); a configMap or secret volume is a read-only
  directory; a `subPath` mount binds that file of the volume's directory, as the kubelet
  does; no volume gets a copy of what the image holds at its mount path (Docker's
  default, never the kubelet's);
- `command` replaces the image's entrypoint and `args` its CMD; env with `$(VAR)`
  references and downward-API fields resolved as the kubelet does;
- a native sidecar (an init container with `restartPolicy: Always`) is started and the
  next container waits for its startupProbe, run from the node against the pod IP;
  `await_probe` waits for a container's readiness (or any other) probe the same way.
  Probes are httpGet or tcpSocket, their port a number or the name of a container port.

The pod runs on `network`: `internal_network` makes one from which nothing reaches
beyond this machine, the node's servers listening on its gateway address.
What the harness supplies because the cluster would: the images (`images` maps the
pod's image names to local ones), the ConfigMaps and Secrets (their decoded data), the
`kubernetes` service variables, and `hosts` (names the cluster's DNS would answer) in
the sandbox's /etc/hosts.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.harness import http_get
from injector.quantity import parse_bytes, parse_quantity
from tests.image.dockerd import Docker
from tests.injector.podrun import SERVICE_ENV, PodFailed, expand


@contextmanager
def internal_network(docker: Docker) -> Iterator[tuple[str, str]]:
    """A Docker network with no route out: (its name, the node's address on it)."""
    name = f"bbnet-{uuid.uuid4().hex[:10]}"
    docker.run("network", "create", "--internal", name)
    try:
        inspected = json.loads(docker.run("network", "inspect", name).stdout)
        yield name, inspected[0]["IPAM"]["Config"][0]["Gateway"]
    finally:
        docker.run("network", "rm", name, check=False)


@dataclass
class DockerPod:
    """A pod spec, run as Docker containers. Use as a context manager."""

    docker: Docker
    pod: dict[str, Any]
    images: Mapping[str, str]
    # The image the sandbox runs `sleep infinity` in (any image with coreutils).
    sandbox_image: str
    workdir: Path
    network: str
    config_maps: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    secrets: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    hosts: Mapping[str, str] = field(default_factory=dict)
    prefix: str = field(default_factory=lambda: f"bbpod-{uuid.uuid4().hex[:10]}")
    pod_ip: str = ""
    _containers: list[str] = field(default_factory=list)
    _volumes: dict[str, str] = field(default_factory=dict)

    @property
    def spec(self) -> dict[str, Any]:
        return self.pod["spec"]

    @property
    def name(self) -> str:
        return str(self.pod.get("metadata", {}).get("name", "pod"))

    def __enter__(self) -> DockerPod:
        try:
            for volume in self.spec.get("volumes") or []:
                self._make_volume(volume)
            self._start_sandbox()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Remove the pod's containers and volumes, whatever state they are in."""
        for container in reversed(self._containers):
            self.docker.run("rm", "-f", "-v", container, check=False, timeout=60)
        self._containers.clear()
        for source in self._volumes.values():
            if not source.startswith("/"):
                self.docker.run("volume", "rm", "-f", source, check=False)
        self._volumes.clear()

    # -- the sandbox -------------------------------------------------------------------

    def _start_sandbox(self) -> None:
        sandbox = f"{self.prefix}-sandbox"
        argv = ["run", "-d", "--name", sandbox, "--network", self.network]
        argv += ["--hostname", self.spec.get("hostname") or self.name]
        argv += [f"--add-host={host}:{ip}" for host, ip in self.hosts.items()]
        argv += ["--read-only", "--cap-drop", "ALL", "--user", "65534:65534"]
        argv += [self.sandbox_image, "sleep", "infinity"]
        self._containers.append(sandbox)
        self.docker.run(*argv)
        inspected = json.loads(self.docker.run("inspect", sandbox).stdout)
        self.pod_ip = inspected[0]["NetworkSettings"]["Networks"][self.network]["IPAddress"]
        if not self.pod_ip:
            raise PodFailed(f"the pod's sandbox got no address on {self.network}")

    # -- volumes -----------------------------------------------------------------------

    def _make_volume(self, volume: dict[str, Any]) -> None:
        name = volume["name"]
        if "configMap" in volume or "secret" in volume:
            self._volumes[name] = str(self._key_files_dir(volume))
            return
        if "persistentVolumeClaim" in volume:
            self._claim_volume(name)
            return
        if "emptyDir" not in volume:
            raise PodFailed(
                f"volume {name}: only emptyDir, persistentVolumeClaim, configMap and secret"
                " are supported"
            )
        empty_dir = volume["emptyDir"] or {}
        docker_name = f"{self.prefix}-{name}"
        argv = ["volume", "create"]
        if empty_dir.get("medium") == "Memory":
            options = ["mode=0777"]
            if "sizeLimit" in empty_dir:
                options.append(f"size={parse_bytes(empty_dir['sizeLimit'])}")
            argv += ["--opt", "type=tmpfs", "--opt", "device=tmpfs"]
            argv += ["--opt", "o=" + ",".join(options)]
        self.docker.run(*argv, docker_name)
        self._volumes[name] = docker_name
        if empty_dir.get("medium") != "Memory":
            self._directory(name).chmod(0o777)

    def _claim_volume(self, name: str) -> None:
        docker_name = f"{self.prefix}-{name}"
        self.docker.run("volume", "create", docker_name)
        self._volumes[name] = docker_name
        root = self._directory(name)
        fs_group = (self.spec.get("securityContext") or {}).get("fsGroup")
        if fs_group is None:
            root.chmod(0o755)
        else:
            os.chown(root, 0, fs_group)
            root.chmod(0o2775)

    def _key_files_dir(self, volume: dict[str, Any]) -> Path:
        """A configMap or secret volume: a directory of its keys (or `items`) as files."""
        if "configMap" in volume:
            source, kind, objects = volume["configMap"], "ConfigMap", self.config_maps
            object_name = source["name"]
        else:
            source, kind, objects = volume["secret"], "Secret", self.secrets
            object_name = source["secretName"]
        data = objects.get(object_name)
        if data is None:
            raise PodFailed(f"volume {volume['name']}: no {kind} {object_name}")
        directory = self.workdir / "volumes" / volume["name"]
        directory.mkdir(parents=True)
        items = source.get("items") or [{"key": k, "path": k} for k in data]
        for item in items:
            target = directory / item["path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(data[item["key"]])
            target.chmod(item.get("mode", source.get("defaultMode", 0o644)))
        directory.chmod(0o755)
        return directory

    def _directory(self, name: str) -> Path:
        """The node's directory of a volume (what a subPath is taken from)."""
        source = self._volumes[name]
        if source.startswith("/"):
            return Path(source)
        inspected = json.loads(self.docker.run("volume", "inspect", source).stdout)
        if (inspected[0].get("Options") or {}).get("type") == "tmpfs":
            raise PodFailed(f"volume {name}: a subPath of a memory-backed emptyDir")
        return Path(inspected[0]["Mountpoint"])

    def volume_file(self, name: str, path: str) -> Path:
        return self._directory(name) / path

    def _mounts(self, container: dict[str, Any]) -> list[str]:
        flags = []
        for mount in container.get("volumeMounts") or []:
            name = mount["name"]
            if name not in self._volumes:
                raise PodFailed(f"container {container['name']}: no volume {name}")
            source = self._volumes[name]
            read_only = mount.get("readOnly") or source.startswith("/")
            if mount.get("subPath"):
                spec = f"type=bind,src={self._directory(name) / mount['subPath']}"
            elif source.startswith("/"):
                spec = f"type=bind,src={source}"
            else:
                spec = f"type=volume,src={source},volume-nocopy"
            spec += f",dst={mount['mountPath']}" + (",readonly" if read_only else "")
            flags += ["--mount", spec]
        return flags

    # -- containers --------------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> None:
        """Run the init containers and start the regular ones, as the kubelet does."""
        deadline = time.monotonic() + timeout
        for container in self.spec.get("initContainers") or []:
            name = self._run(container)
            if container.get("restartPolicy") == "Always":
                self._await_startup(container, deadline)
            elif (code := self.wait(container["name"], deadline - time.monotonic())) != 0:
                raise PodFailed(
                    f"init container {name} exited {code}: {self.logs(container['name'])}"
                )
        for container in self.spec["containers"]:
            self._run(container)
            self._await_startup(container, deadline)

    def container_name(self, name: str) -> str:
        return f"{self.prefix}-{name}"

    def wait(self, name: str, timeout: float = 120.0) -> int:
        """The exit code of a container that runs to completion."""
        done = self.docker.run("wait", self.container_name(name), timeout=max(timeout, 1))
        return int(done.stdout)

    def logs(self, name: str) -> str:
        done = self.docker.run("logs", self.container_name(name), check=False)
        return (done.stdout + done.stderr).decode(errors="replace")[-3000:]

    def _field(self, path: str) -> str:
        metadata = self.pod.get("metadata", {})
        values = {
            "metadata.name": self.name,
            "metadata.namespace": metadata.get("namespace", "default"),
            "status.podIP": self.pod_ip,
        }
        if path not in values:
            raise PodFailed(f"fieldRef {path} is not supported here")
        return values[path]

    def _env(self, container: dict[str, Any]) -> dict[str, str]:
        defined: dict[str, str] = dict(SERVICE_ENV)
        for entry in container.get("env") or []:
            if "valueFrom" in entry:
                if "fieldRef" not in entry["valueFrom"]:
                    raise PodFailed(f"env {entry['name']}: only fieldRef is supported here")
                value = self._field(entry["valueFrom"]["fieldRef"]["fieldPath"])
            else:
                value = expand(entry.get("value", ""), defined)
            defined[entry["name"]] = value
        return defined

    def _security(self, container: dict[str, Any]) -> list[str]:
        pod_context = self.spec.get("securityContext") or {}
        context = container.get("securityContext") or {}
        flags = []
        uid = context.get("runAsUser", pod_context.get("runAsUser"))
        gid = context.get("runAsGroup", pod_context.get("runAsGroup"))
        if uid is not None:
            flags += ["--user", f"{uid}:{gid if gid is not None else uid}"]
        if context.get("runAsNonRoot", pod_context.get("runAsNonRoot")) and not uid:
            raise PodFailed(f"container {container['name']}: runAsNonRoot without a UID")
        if context.get("readOnlyRootFilesystem"):
            flags.append("--read-only")
        capabilities = context.get("capabilities") or {}
        flags += [f"--cap-drop={c}" for c in capabilities.get("drop") or []]
        flags += [f"--cap-add={c}" for c in capabilities.get("add") or []]
        if context.get("allowPrivilegeEscalation") is False:
            flags += ["--security-opt", "no-new-privileges"]
        seccomp = (context.get("seccompProfile") or {}).get("type", "RuntimeDefault")
        if seccomp != "RuntimeDefault":
            raise PodFailed(f"container {container['name']}: seccomp {seccomp} not supported")
        return flags

    def _resources(self, container: dict[str, Any]) -> list[str]:
        limits = (container.get("resources") or {}).get("limits") or {}
        flags = []
        if "memory" in limits:
            flags += ["--memory", str(parse_bytes(limits["memory"]))]
        if "cpu" in limits:
            flags += ["--cpus", str(float(parse_quantity(limits["cpu"])))]
        return flags

    def _run(self, container: dict[str, Any]) -> str:
        image = self.images.get(container["image"])
        if image is None:
            raise PodFailed(f"container {container['name']}: no image {container['image']}")
        env = self._env(container)
        command = [expand(a, env) for a in container.get("command") or []]
        args = [expand(a, env) for a in container.get("args") or []]
        if not command:
            raise PodFailed(f"container {container['name']}: the test images have no ENTRYPOINT")
        name = self.container_name(container["name"])
        argv = ["run", "-d", "--name", name, "--network", f"container:{self.prefix}-sandbox"]
        argv += self._security(container) + self._resources(container) + self._mounts(container)
        argv += [f"--env={k}={v}" for k, v in env.items()]
        if container.get("workingDir"):
            argv += ["--workdir", container["workingDir"]]
        argv += ["--entrypoint", command[0], image, *command[1:], *args]
        self._containers.append(name)
        self.docker.run(*argv)
        return name

    def await_probe(self, name: str, kind: str = "readinessProbe", timeout: float = 60.0) -> None:
        """Wait until the container's `kind` probe passes, as the kubelet probes it."""
        container = next(
            c for c in (self.spec.get("initContainers") or []) + self.spec["containers"]
            if c["name"] == name
        )  # fmt: skip
        self._await_probe(container, kind, time.monotonic() + timeout)

    def _await_startup(self, container: dict[str, Any], deadline: float) -> None:
        self._await_probe(container, "startupProbe", deadline)

    def _await_probe(self, container: dict[str, Any], kind: str, deadline: float) -> None:
        probe = container.get(kind)
        if probe is None:
            return
        period = probe.get("periodSeconds", 10)
        name = self.container_name(container["name"])
        target = self._probe_target(container, probe)
        for _ in range(probe.get("failureThreshold", 3)):
            state = json.loads(self.docker.run("inspect", name).stdout)[0]["State"]
            if not state["Running"]:
                raise PodFailed(
                    f"container {container['name']} exited {state['ExitCode']} "
                    f"before its {kind} passed: {self.logs(container['name'])}"
                )
            if self._probe_passes(probe, target):
                return
            if time.monotonic() > deadline:
                break
            time.sleep(period)
        raise PodFailed(
            f"container {container['name']}: {kind} {target} failed: {self.logs(container['name'])}"
        )

    def _probe_target(self, container: dict[str, Any], probe: dict[str, Any]) -> str:
        """The probe's URL (httpGet) or host:port (tcpSocket), named ports resolved."""
        kind = "httpGet" if "httpGet" in probe else "tcpSocket"
        if kind not in probe:
            raise PodFailed(
                f"container {container['name']}: only httpGet and tcpSocket probes are supported"
            )
        action = probe[kind]
        port = action["port"]
        if isinstance(port, str):
            named = [p for p in container.get("ports") or [] if p.get("name") == port]
            if not named:
                raise PodFailed(f"container {container['name']}: no port named {port}")
            port = named[0]["containerPort"]
        address = f"{action.get('host', self.pod_ip)}:{port}"
        return f"http://{address}{action.get('path', '/')}" if kind == "httpGet" else address

    @staticmethod
    def _probe_passes(probe: dict[str, Any], target: str) -> bool:
        timeout = probe.get("timeoutSeconds", 1)
        try:
            if "httpGet" in probe:
                status, _ = http_get(target, timeout=timeout)
                return 200 <= status < 400
            host, port = target.rsplit(":", 1)
            socket.create_connection((host, int(port)), timeout=timeout).close()
            return True
        except OSError:
            return False

    def stats(self, port: int) -> dict[str, Any]:
        status, body = http_get(f"http://{self.pod_ip}:{port}/stats")
        assert status == 200, body
        return json.loads(body)  # type: ignore[no-any-return]
