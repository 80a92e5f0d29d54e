"""The names the injector writes into pods: labels, annotations, containers, volumes, paths.

Kept in one place because the webhook configuration (the chart), `decide` and `mutate`
must agree on them, and because they are part of the documented contract.
"""

from __future__ import annotations

# Opt-in (pod label, or namespace label `enabled`) and opt-out (pod label or annotation).
INJECT = "burstbuffer.io/inject"
# What the injector did, as JSON (see mutate.status).
STATUS = "burstbuffer.io/status"
# Per-pod overrides.
BUFFER_SIZE = "burstbuffer.io/buffer-size"
BUFFER_MEDIUM = "burstbuffer.io/buffer-medium"
INTERCEPT = "burstbuffer.io/intercept"
STAGE_IN = "burstbuffer.io/stage-in"
CAPTURE = "burstbuffer.io/capture"
SIDECAR_CPU = "burstbuffer.io/sidecar-cpu"
HTTP_FRESHNESS = "burstbuffer.io/http-freshness"
# Plain Prometheus' pod annotations (the kubernetes-pods scrape job), when configured.
PROMETHEUS = "prometheus.io/"
PROMETHEUS_SCRAPE = PROMETHEUS + "scrape"
PROMETHEUS_PORT = PROMETHEUS + "port"
PROMETHEUS_PATH = PROMETHEUS + "path"

# The sidecar; in classic mode also the init container that creates the CA and trust
# files before the pod's own init containers run; with the transparent capture, the init
# container that installs the pod's redirect rules.
CONTAINER = "burstbuffer"
INIT_CONTAINER = "burstbuffer-init"
REDIRECT_CONTAINER = "burstbuffer-redirect"
OWN_CONTAINERS = (CONTAINER, INIT_CONTAINER, REDIRECT_CONTAINER)

# Volume name stems; a pod that already uses one for something else gets `-1`, `-2`...
BUFFER_VOLUME = "burstbuffer-buffer"
CA_VOLUME = "burstbuffer-ca"
TRUST_VOLUME = "burstbuffer-trust"
UPSTREAM_CA_VOLUME = "burstbuffer-upstream-ca"
PARENT_CA_VOLUME = "burstbuffer-parent-ca"

# Where the sidecar mounts its volumes.
BUFFER_DIR = "/var/lib/burstbuffer/buffer"
CA_DIR = "/var/lib/burstbuffer/ca"
# The sidecar's --ca-dir: a directory it creates itself, so that it can make it 0700 (an
# emptyDir's own root is 0777 and root's).
CA_PRIVATE_DIR = CA_DIR + "/private"
TRUST_DIR = "/var/lib/burstbuffer/trust"
# The configured upstreamCA ConfigMap, in the sidecar only.
UPSTREAM_CA_DIR = "/var/lib/burstbuffer/upstream-ca"
# The configured parentCA ConfigMap, in the sidecar only.
PARENT_CA_DIR = "/var/lib/burstbuffer/parent-ca"
# The trust files the sidecar writes into TRUST_DIR (DESIGN.md, --trust-dir).
CA_FILE = "ca.crt"
BUNDLE_FILE = "ca-bundle.crt"
TRUST_STORE_FILE = "ca-bundle.p12"

# Downward-API variables of the sidecar container.
POD_IP = "POD_IP"
POD_UID = "POD_UID"
ADMIN_PORT_NAME = "bb-admin"
