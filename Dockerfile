# One image for both programs: `burstbuffer-sidecar` (the injected container) and
# `burstbuffer-injector` (the webhook Deployment). The chart sets `command:`.
# Build: docker build -t ghcr.io/burstbuffer/burstbuffer:0.1.0 .

FROM python:3.12-slim-bookworm AS builder
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/burstbuffer
# Dependencies first, so that a source change does not reinstall them.
COPY pyproject.toml README.md /src/
RUN mkdir -p /src/sidecar /src/injector /src/certs \
 && touch /src/sidecar/__init__.py /src/injector/__init__.py /src/certs/__init__.py \
 && /opt/burstbuffer/bin/pip install /src \
 && /opt/burstbuffer/bin/pip uninstall -y burstbuffer
COPY sidecar /src/sidecar
COPY injector /src/injector
COPY certs /src/certs
RUN /opt/burstbuffer/bin/pip install --no-deps /src

FROM python:3.12-slim-bookworm
# iptables: the `transparent` capture's init container installs the pod's redirect
# rules with this same image (as root with NET_ADMIN; everything else runs as 65532).
RUN apt-get update \
 && apt-get install -y --no-install-recommends iptables \
 && rm -rf /var/lib/apt/lists/*
COPY --from=builder /opt/burstbuffer /opt/burstbuffer
ENV PATH=/opt/burstbuffer/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
# Numeric, so that the kubelet can enforce runAsNonRoot without an /etc/passwd lookup.
USER 65532:65532
EXPOSE 3128 3129 8443
CMD ["burstbuffer-sidecar", "--help"]
