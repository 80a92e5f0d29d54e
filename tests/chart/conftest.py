"""The real sidecar's origin and hosts, as the sidecar's own end-to-end tests make them,
for the test of the dashboard and the alerts against a real Prometheus."""

from tests.sidecar.conftest import (  # noqa: F401
    dataset,
    hosts_file,
    needs_root,
    origin,
)
