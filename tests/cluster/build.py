"""The one-node cluster's binaries, built from the pinned Go modules in `tools/`.

Kubernetes (kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy,
kubectl), etcd and Helm come from `tools/go.mod`; CoreDNS with the plugins the cluster
uses from `tools/dns`, local-path-provisioner from `tools/storage`, the pod sandbox's
pause from `tools/pause`. They are built once into the cache (`bin/` under
`~/.cache/burstbuffer/cluster`) and rebuilt only when a module's go.mod, go.sum or
source changes (a stamp per module holds the digest it was built from). Go's own build
and module caches make a rebuild after a small change cheap.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bench.cachedir import cache_dir
from tests.registries import package_manager_env

TOOLS = Path(__file__).resolve().parent / "tools"
MINIMUM_GO = (1, 24)  # the `tool` directives of go.mod
BUILD_TIMEOUT = 3600.0  # seconds: a first build of Kubernetes on two cores takes about 25 min
# Where Go is usually installed when Debian's golang-go (older) comes first on PATH.
GO_CANDIDATES = ("/usr/local/go/bin/go", "/usr/lib/go/bin/go")


class BuildUnavailable(RuntimeError):
    """The binaries cannot be built here (no Go new enough); the message says why."""


@dataclass(frozen=True)
class Module:
    """One Go module of `tools/` and what `go build` makes of it."""

    folder: Path
    targets: tuple[str, ...]  # package patterns; `tool` builds the go.mod's tool directives
    static: bool = False  # no cgo: the binary runs in an image without a C library
    # Binaries go build names after their package's folder, renamed: (built, wanted).
    renames: tuple[tuple[str, str], ...] = ()
    # Version variables a release build stamps in with -X: (variable, module it names).
    versions: tuple[tuple[str, str], ...] = ()


MODULES = (
    Module(
        TOOLS,
        ("tool",),
        renames=(("server", "etcd"),),  # go.etcd.io/etcd/server/v3
        # What `kubectl version`, the API server's /version and Helm's kubeVersion checks
        # read; without them the build says v0.0.0 and charts needing 1.29 refuse it.
        versions=(
            ("k8s.io/component-base/version.gitVersion", "k8s.io/kubernetes"),
            ("k8s.io/client-go/pkg/version.gitVersion", "k8s.io/kubernetes"),
            ("helm.sh/helm/v3/internal/version.version", "helm.sh/helm/v3"),
        ),
    ),
    Module(TOOLS, ("./pause",), static=True),
    Module(TOOLS / "dns", (".",)),
    Module(TOOLS / "storage", ("tool",)),
)


def bin_dir() -> Path:
    return cache_dir("cluster", "bin")


def find_go() -> str:
    """The path of a Go new enough for the modules: PATH first, then the usual places."""
    seen = []
    for candidate in (shutil.which("go"), *GO_CANDIDATES):
        if not candidate or not os.access(candidate, os.X_OK):
            continue
        version = subprocess.run(
            [candidate, "env", "GOVERSION"], capture_output=True, text=True, timeout=60
        ).stdout.strip()
        match = re.match(r"go(\d+)\.(\d+)", version)
        if match and (int(match[1]), int(match[2])) >= MINIMUM_GO:
            return candidate
        seen.append(f"{candidate} ({version or 'unknown version'})")
    raise BuildUnavailable(
        f"the cluster's binaries need Go >= {'.'.join(map(str, MINIMUM_GO))}; found "
        f"{', '.join(seen) or 'none'} (install Go from go.dev into /usr/local/go)"
    )


def required_version(go_mod: str, module: str) -> str:
    """The version a go.mod requires of `module`."""
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)} (v\S+)", go_mod, re.M)
    if match is None:
        raise ValueError(f"go.mod requires no {module}")
    return match.group(1)


def ldflags(module: Module) -> str:
    """Strip the symbol tables; stamp the versions (Kubernetes' own build does the same,
    with its major and minor and a clean tree state beside the version)."""
    go_mod = (module.folder / "go.mod").read_text()
    flags = ["-s", "-w"]
    for variable, named in module.versions:
        version = required_version(go_mod, named)
        flags.append(f"-X {variable}={version}")
        if variable.endswith(".gitVersion"):
            package = variable.rsplit(".", 1)[0]
            major, minor = version.lstrip("v").split(".")[:2]
            flags += [f"-X {package}.gitMajor={major}", f"-X {package}.gitMinor={minor}",
                      f"-X {package}.gitTreeState=clean"]  # fmt: skip
    return " ".join(flags)


def digest(module: Module) -> str:
    """What a module's build depends on: its go.mod, go.sum and Go sources."""
    folder = module.folder
    files = [folder / "go.mod", folder / "go.sum"]
    for target in module.targets:
        if target.startswith("."):
            files += sorted((folder / target).glob("*.go"))
    sha = hashlib.sha256()
    for path in files:
        sha.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    sha.update(f"{module.targets} {ldflags(module)}".encode())
    return sha.hexdigest()


def build(log: Path | None = None) -> Path:
    """Build what is missing or out of date; the folder holding the binaries."""
    target = bin_dir()
    target.mkdir(parents=True, exist_ok=True)
    go = None
    for module in MODULES:
        name = f"{module.folder.name}:{module.targets}"
        stamp = target / f".built-{hashlib.sha256(name.encode()).hexdigest()[:12]}"
        built_from = digest(module)
        if stamp.is_file() and stamp.read_text() == built_from:
            continue
        go = go or find_go()
        env = package_manager_env(GOFLAGS="-mod=readonly -buildvcs=false", GOTOOLCHAIN="local")
        if module.static:
            env["CGO_ENABLED"] = "0"
        argv = [go, "build", "-trimpath", f"-ldflags={ldflags(module)}", "-o", f"{target}/",
                *module.targets]  # fmt: skip
        output = open(log, "ab") if log else subprocess.DEVNULL
        try:
            done = subprocess.run(
                argv, cwd=module.folder, env=env, stdout=output, stderr=subprocess.PIPE,
                timeout=BUILD_TIMEOUT,
            )  # fmt: skip
        finally:
            if log:
                output.close()  # type: ignore[union-attr]
        if done.returncode != 0:
            raise RuntimeError(
                f"go build in {module.folder.relative_to(TOOLS.parent)} failed: "
                f"{done.stderr.decode(errors='replace')[-3000:]}"
            )
        for built, wanted in module.renames:
            (target / built).replace(target / wanted)
        stamp.write_text(built_from)
    return target
