"""Everything that touches mitmproxy, behind its one version pin.

mitmproxy terminates what the lean front end does not (plain HTTP, the hostAliases and
transparent listeners, non-HTTP/1.1 TLS). No module outside this package imports it
(an import-linter contract in `make test`), and this `__init__` runs before any module
of the package does, so two things hold wherever mitmproxy is loaded:

- The pin: `respond` and this file are written against mitmproxy's insides; another
  release is refused at import, not discovered in production.
- mitmproxy's addons package without the forty default addons a cache does not need.
  Importing anything from `mitmproxy.addons` (even `mitmproxy.master`, which imports
  `mitmproxy.addons.termlog`) first runs the package's `__init__`, which imports every
  default addon: about 0.2 s of a worker's 0.45 s start, and their memory. A worker
  needs five. The package is registered here without running its `__init__`; each
  addon module is then loaded when something imports it, and only then."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
import types

PINNED_MITMPROXY = "12.2.3"


def _register_bare_package(name: str) -> None:
    if name in sys.modules:
        return  # imported already, with its __init__: nothing to save
    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None:
        raise ImportError(f"{name} is not a package")
    package = types.ModuleType(name)
    package.__path__ = list(spec.submodule_search_locations)
    package.__spec__ = spec
    package.__package__ = name
    sys.modules[name] = package


if importlib.metadata.version("mitmproxy") != PINNED_MITMPROXY:
    raise ImportError(
        f"sidecar.mitm is written against mitmproxy {PINNED_MITMPROXY}'s layout, "
        f"found {importlib.metadata.version('mitmproxy')}: re-validate it before changing the pin"
    )
_register_bare_package("mitmproxy.addons")
