#!/usr/bin/env bash
# burstbuffer on a real cluster, end to end:
#   1. install the chart (helm upgrade --install ... --wait),
#   2. label a namespace burstbuffer.io/inject=enabled,
#   3. check through the webhook (server-side dry runs) who gets the sidecar: pods of the
#      enabled namespace, not those labelled burstbuffer.io/inject=false, and pods
#      labelled burstbuffer.io/inject=true elsewhere,
#   4. `burstbuffer check` of the enabled namespace, and `burstbuffer status` reading a
#      running injected pod's /stats through the API server's pod proxy,
#   5. run a Job whose stock-image container (python:3.12) downloads the same file twice,
#      with GNU wget and then Python's urllib, and assert from the sidecar's /stats that
#      the second download was a hit, and that the Job completes (the native sidecar
#      must not keep it running).
#
# Cluster: by default a kind cluster is created (docker and kind needed), the image is
# built from this checkout and loaded into it, and the cluster is deleted at the end.
# With E2E_USE_CURRENT_CONTEXT=1 the current kubectl context is used instead; E2E_IMAGE
# must then name an image (repository:tag) that cluster can pull.
#
# Needs kubectl and helm (3.8+ or 4), and egress from the cluster to E2E_URL's host,
# which must be one of the chart's default intercepted hosts.
#
# Environment (defaults in brackets):
#   E2E_USE_CURRENT_CONTEXT [0]   1: use the current kubectl context, create no cluster
#   E2E_KIND_CLUSTER [burstbuffer-e2e]   name of the kind cluster
#   E2E_KIND_NODE_IMAGE []        kind node image (kindest/node:v1.29.x or newer)
#   E2E_IMAGE [burstbuffer:e2e]   the burstbuffer image, repository:tag
#   E2E_URL [a 28 KiB MNIST file on storage.googleapis.com]
#   E2E_APP_IMAGE [python:3.12]   the Job's stock image (needs bash, GNU wget, python3)
#   E2E_KEEP [0]                  1: leave the cluster / release / namespaces behind
#   E2E_TIMEOUT [600]             seconds to wait for the Job
#   BURSTBUFFER_CLI [burstbuffer] the operators' CLI (the test passes the checkout's)
#
# `e2e-kind.sh --print-job` prints the Job manifest and exits (the test suite checks it).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE="$ROOT/tests/cluster"

USE_CURRENT_CONTEXT=${E2E_USE_CURRENT_CONTEXT:-0}
KIND_CLUSTER=${E2E_KIND_CLUSTER:-burstbuffer-e2e}
KIND_NODE_IMAGE=${E2E_KIND_NODE_IMAGE:-}
IMAGE=${E2E_IMAGE:-burstbuffer:e2e}
URL=${E2E_URL:-https://storage.googleapis.com/cvdf-datasets/mnist/train-labels-idx1-ubyte.gz}
APP_IMAGE=${E2E_APP_IMAGE:-python:3.12}
KEEP=${E2E_KEEP:-0}
TIMEOUT=${E2E_TIMEOUT:-600}
CLI=${BURSTBUFFER_CLI:-burstbuffer}

# A release of its own, so that an installation already on the cluster is left alone.
RELEASE=burstbuffer-e2e
RELEASE_NAMESPACE=burstbuffer-e2e-system
NAMESPACE=burstbuffer-e2e
OTHER_NAMESPACE=burstbuffer-e2e-other
JOB=download-twice
ADMIN_PORT=3129 # the chart's sidecar.adminPort

CREATED_CLUSTER=0
WORK=""

log() { printf '\n== %s\n' "$*" >&2; }
fail() {
  printf '\nFAIL: %s\n' "$*" >&2
  exit 1
}
need() {
  for tool in "$@"; do
    command -v "$tool" >/dev/null 2>&1 || fail "$tool is needed on PATH"
  done
}

job_manifest() {
  cat <<EOF
apiVersion: batch/v1
kind: Job
metadata:
  name: $JOB
  namespace: $NAMESPACE
spec:
  backoffLimit: 0
  activeDeadlineSeconds: $TIMEOUT
  template:
    metadata:
      labels:
        app.kubernetes.io/name: burstbuffer-e2e
    spec:
      restartPolicy: Never
      containers:
        - name: download
          image: $APP_IMAGE
          command: [bash, /e2e/download-twice.sh]
          env:
            - name: E2E_URL
              value: "$URL"
            - name: E2E_ADMIN_PORT
              value: "$ADMIN_PORT"
            - name: POD_IP
              valueFrom:
                fieldRef:
                  fieldPath: status.podIP
          volumeMounts:
            - name: e2e
              mountPath: /e2e
              readOnly: true
      volumes:
        - name: e2e
          configMap:
            name: $JOB
EOF
}

diagnose() {
  log "diagnostics"
  kubectl get pods -A -o wide || true
  kubectl describe pods -n "$NAMESPACE" -l app.kubernetes.io/name=burstbuffer-e2e || true
  kubectl logs -n "$NAMESPACE" -l app.kubernetes.io/name=burstbuffer-e2e \
    --all-containers --prefix --tail=200 || true
  kubectl logs -n "$RELEASE_NAMESPACE" -l app.kubernetes.io/component=injector \
    --prefix --tail=200 || true
}

cleanup() {
  local status=$?
  [ "$status" -eq 0 ] || diagnose
  if [ "$KEEP" = 1 ]; then
    log "E2E_KEEP=1: leaving everything in place"
  elif [ "$CREATED_CLUSTER" = 1 ]; then
    log "deleting kind cluster $KIND_CLUSTER"
    kind delete cluster --name "$KIND_CLUSTER" || true
  else
    log "removing the release and the test namespaces"
    helm uninstall "$RELEASE" -n "$RELEASE_NAMESPACE" --wait || true
    kubectl delete namespace "$NAMESPACE" "$OTHER_NAMESPACE" "$RELEASE_NAMESPACE" \
      --ignore-not-found --wait=false || true
  fi
  [ -z "$WORK" ] || rm -rf "$WORK"
  exit "$status"
}

setup_cluster() {
  if [ "$USE_CURRENT_CONTEXT" = 1 ]; then
    kubectl cluster-info >/dev/null || fail "no cluster reachable in the current kubectl context"
    log "using the current context: $(kubectl config current-context)"
    return
  fi
  need docker kind
  docker info >/dev/null 2>&1 || fail "the docker engine is not reachable"
  # A kubeconfig of our own: the user's current context is never switched.
  export KUBECONFIG="$WORK/kubeconfig"
  if ! kind get clusters 2>/dev/null | grep -qx "$KIND_CLUSTER"; then
    log "creating kind cluster $KIND_CLUSTER"
    CREATED_CLUSTER=1
    kind create cluster --name "$KIND_CLUSTER" --wait 180s \
      ${KIND_NODE_IMAGE:+--image "$KIND_NODE_IMAGE"}
  fi
  kind get kubeconfig --name "$KIND_CLUSTER" >"$KUBECONFIG"
  log "building $IMAGE"
  docker build --tag "$IMAGE" "$ROOT"
  kind load docker-image "$IMAGE" --name "$KIND_CLUSTER"
}

install_chart() {
  log "installing the chart ($IMAGE)"
  # The tag is what follows the last ":" of the last path segment (a registry may have a port).
  [[ "$IMAGE" != *@* && "${IMAGE##*/}" == *:* ]] || fail "E2E_IMAGE must be repository:tag"
  helm upgrade --install "$RELEASE" "$ROOT/charts/burstbuffer" \
    --namespace "$RELEASE_NAMESPACE" --create-namespace \
    --set image.repository="${IMAGE%:*}" --set image.tag="${IMAGE##*:}" \
    --wait --timeout 5m
  kubectl create namespace "$NAMESPACE" --dry-run=client -o yaml | kubectl apply -f -
  kubectl label namespace "$NAMESPACE" burstbuffer.io/inject=enabled --overwrite
  kubectl create namespace "$OTHER_NAMESPACE" --dry-run=client -o yaml | kubectl apply -f -
}

# The container names of a pod as the API server would store it (after the webhook),
# without creating it: a server-side dry run goes through admission (sideEffects: None).
stored_containers() {
  local namespace=$1
  shift
  kubectl run burstbuffer-probe --namespace "$namespace" --image=busybox --restart=Never \
    --dry-run=server -o jsonpath='{.spec.initContainers[*].name} {.spec.containers[*].name}' \
    "$@" -- true
}

check_selection() {
  log "checking which pods the webhook injects"
  local got=""
  # The webhook's Service may take a few seconds to reach the API server's view of
  # endpoints after the rollout; with failurePolicy Ignore a pod is meanwhile not injected.
  for _ in $(seq 30); do
    got=$(stored_containers "$NAMESPACE")
    [[ " $got " == *" burstbuffer "* ]] && break
    sleep 2
  done
  [[ " $got " == *" burstbuffer "* ]] || fail "a pod of the enabled namespace was not injected: $got"
  got=$(stored_containers "$NAMESPACE" --labels=burstbuffer.io/inject=false)
  [[ " $got " != *" burstbuffer "* ]] || fail "a pod labelled inject=false was injected: $got"
  got=$(stored_containers "$OTHER_NAMESPACE" --labels=burstbuffer.io/inject=true)
  [[ " $got " == *" burstbuffer "* ]] || fail "a pod labelled inject=true was not injected: $got"
  got=$(stored_containers "$OTHER_NAMESPACE")
  [[ " $got " != *" burstbuffer "* ]] || fail "a pod of a plain namespace was injected: $got"
  echo "selection as expected"
}

# The operators' CLI on the real API server: every check passes for the enabled
# namespace, and a running injected pod's /stats is read through the pod proxy.
operate() {
  log "burstbuffer check -n $NAMESPACE"
  "$CLI" check -n "$NAMESPACE" --injector-namespace "$RELEASE_NAMESPACE" \
    --injector-name "$RELEASE-injector" || fail "burstbuffer check failed"
  log "burstbuffer status -n $NAMESPACE"
  kubectl delete pod status-probe -n "$NAMESPACE" --ignore-not-found --wait=true
  kubectl run status-probe -n "$NAMESPACE" --image="$APP_IMAGE" --restart=Never -- sleep "$TIMEOUT"
  kubectl wait pod/status-probe -n "$NAMESPACE" --for=condition=Ready --timeout=300s
  local report
  report=$("$CLI" status -n "$NAMESPACE" -o json) || fail "burstbuffer status failed"
  "$CLI" status -n "$NAMESPACE"
  python3 -c '
import json, sys
pods = {p["pod"]: p for p in json.load(sys.stdin)["pods"]}
probe = pods.get("status-probe")
assert probe and probe["reachable"] and probe["state"] == "ok", probe
' <<<"$report" || fail "burstbuffer status did not read the probe pod's sidecar: $report"
  kubectl delete pod status-probe -n "$NAMESPACE" --wait=false
}

run_job() {
  log "running Job $JOB ($APP_IMAGE downloads $URL twice)"
  kubectl delete job "$JOB" -n "$NAMESPACE" --ignore-not-found --wait=true
  kubectl create configmap "$JOB" -n "$NAMESPACE" \
    --from-file="$HERE/job/download-twice.sh" --from-file="$HERE/job/fetch_again.py" \
    --dry-run=client -o yaml | kubectl apply -f -
  job_manifest | kubectl apply -f -

  local deadline=$((SECONDS + TIMEOUT)) state=""
  while [ "$SECONDS" -lt "$deadline" ]; do
    state=$(kubectl get job "$JOB" -n "$NAMESPACE" \
      -o jsonpath='{range .status.conditions[?(@.status=="True")]}{.type} {end}')
    case " $state " in
      *" Complete "*) break ;;
      *" Failed "*) fail "Job $JOB failed" ;;
    esac
    sleep 3
  done
  [[ " $state " == *" Complete "* ]] ||
    fail "Job $JOB did not complete within ${TIMEOUT}s (a sidecar keeping it running?)"

  local pod
  pod=$(kubectl get pods -n "$NAMESPACE" -l job-name="$JOB" -o jsonpath='{.items[0].metadata.name}')
  local first policy phase
  first=$(kubectl get pod "$pod" -n "$NAMESPACE" -o jsonpath='{.spec.initContainers[0].name}')
  policy=$(kubectl get pod "$pod" -n "$NAMESPACE" -o jsonpath='{.spec.initContainers[0].restartPolicy}')
  phase=$(kubectl get pod "$pod" -n "$NAMESPACE" -o jsonpath='{.status.phase}')
  [ "$first" = burstbuffer ] && [ "$policy" = Always ] ||
    fail "pod $pod has no native burstbuffer sidecar (initContainers[0]: $first, $policy)"
  [ "$phase" = Succeeded ] || fail "pod $pod is $phase, not Succeeded"
  kubectl get pod "$pod" -n "$NAMESPACE" \
    -o jsonpath='{.metadata.annotations.burstbuffer\.io/status}{"\n"}'

  local logs line hits misses
  logs=$(kubectl logs "$pod" -n "$NAMESPACE" -c download)
  echo "$logs"
  line=$(grep '^BURSTBUFFER_E2E ' <<<"$logs") || fail "the Job printed no stats line"
  hits=$(sed -n 's/.* hits=\([0-9]*\).*/\1/p' <<<"$line")
  misses=$(sed -n 's/.* misses=\([0-9]*\).*/\1/p' <<<"$line")
  [ "${hits:-0}" -ge 1 ] || fail "the second download was not a hit ($line)"
  [ "${misses:-0}" -ge 1 ] || fail "the first download was not a miss ($line)"
  log "PASS: injected, second download served from the buffer ($line), Job completed"
}

main() {
  case "${1:-}" in
    --print-job)
      job_manifest
      return
      ;;
    "") ;;
    *)
      echo "usage: $0 [--print-job]" >&2
      exit 2
      ;;
  esac
  need kubectl helm
  WORK=$(mktemp -d)
  trap cleanup EXIT
  setup_cluster
  install_chart
  check_selection
  operate
  run_job
}

main "$@"
