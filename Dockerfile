# One image for both programs: `burstbuffer-sidecar` (the injected container) and
# `burstbuffer-injector` (the webhook Deployment). The chart sets `command:`.
# Build: docker build -t ghcr.io/burstbuffer/burstbuffer:0.1.0 .
# BASE is any Debian-like image whose `python` is >= 3.12 with `venv` and apt, e.g.
# one made without a registry by debootstrap + `docker import` (see docs/image.md), and
# whose apt has a Rust toolchain >= 1.85 for the build stage (Debian 13, trixie, on).

ARG BASE=python:3.12-slim-trixie

FROM ${BASE} AS deps
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# Behind a private index or a TLS-inspecting proxy: --build-arg PIP_INDEX_URL=URL and
# --build-arg PIP_CA="$(cat extra-ca.pem)" (certificates pip trusts on top of the base's
# own roots). Arguments of the build stages only, so neither reaches the final image.
ARG PIP_INDEX_URL
ARG PIP_CA
RUN python -m venv /opt/burstbuffer \
 && if [ -n "$PIP_CA" ]; then \
      { cat /etc/ssl/certs/ca-certificates.crt; printf '%s\n' "$PIP_CA"; } > /tmp/pip-ca.pem; fi
# Dependencies first, so that a change of the source or the README does not reinstall
# them: the list is read from pyproject.toml alone.
COPY pyproject.toml /src/
RUN /opt/burstbuffer/bin/python -c 'import tomllib; print("\n".join(tomllib.load(open("/src/pyproject.toml", "rb"))["project"]["dependencies"]))' > /tmp/requirements.txt \
 && /opt/burstbuffer/bin/pip install ${PIP_CA:+--cert /tmp/pip-ca.pem} -r /tmp/requirements.txt

FROM deps AS builder
ARG PIP_INDEX_URL
ARG PIP_CA
# The sidecar's Rust core (sidecar/core/, PyO3) is compiled here, with the crates its
# Cargo.lock pins; the final stage copies the built module and no toolchain.
RUN apt-get update \
 && apt-get install -y --no-install-recommends cargo rustc gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
COPY README.md /src/
COPY sidecar /src/sidecar
COPY injector /src/injector
COPY certs /src/certs
# The project alone, staged under /staging as it will lie in the venv: the final stage
# copies the dependencies and the project as two layers, and only the small one changes
# with the source.
RUN if [ -n "$PIP_CA" ]; then export CARGO_HTTP_CAINFO=/tmp/pip-ca.pem; fi \
 && /opt/burstbuffer/bin/pip install ${PIP_CA:+--cert /tmp/pip-ca.pem} --no-deps \
      --root /staging /src

FROM ${BASE}
# iptables: the `transparent` capture's init container installs the pod's redirect
# rules with this same image (as root with NET_ADMIN; everything else runs as 65532).
RUN apt-get update \
 && apt-get install -y --no-install-recommends iptables \
 && rm -rf /var/lib/apt/lists/*
COPY --from=deps /opt/burstbuffer /opt/burstbuffer
COPY --from=builder /staging/ /
ENV PATH=/opt/burstbuffer/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
# Numeric, so that the kubelet can enforce runAsNonRoot without an /etc/passwd lookup.
USER 65532:65532
EXPOSE 3128 3129 8443
CMD ["burstbuffer-sidecar", "--help"]
