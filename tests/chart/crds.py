"""Structural schemas for the custom resources the chart renders.

kubernetes-validate knows only built-in kinds. For cert-manager's Issuer and
Certificate and the Prometheus Operator's ServiceMonitor, PodMonitor and PrometheusRule, these are
the parts of their CRDs' OpenAPI schemas (cert-manager.io/v1, monitoring.coreos.com/v1)
that a chart like this one may use, with unknown fields refused: a misspelt field in
a template fails here instead of being pruned silently by the API server.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jsonschema

_STRING = {"type": "string"}
_NAME = {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"}
_DURATION = {"type": "string", "pattern": "^([0-9]+(\\.[0-9]+)?(ns|us|ms|s|m|h))+$"}
_STRING_MAP = {"type": "object", "additionalProperties": _STRING}


def _object(required: list[str], **properties: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": required,
        "properties": properties,
    }


_METADATA = _object(
    ["name", "namespace"],
    name=_NAME,
    namespace=_NAME,
    labels=_STRING_MAP,
    annotations=_STRING_MAP,
)

_LABEL_SELECTOR = _object(
    [],
    matchLabels=_STRING_MAP,
    matchExpressions={
        "type": "array",
        "items": _object(
            ["key", "operator"],
            key=_STRING,
            operator={"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
            values={"type": "array", "items": _STRING},
        ),
    },
)

_SECRET_KEY = _object(["name", "key"], name=_NAME, key=_STRING, optional={"type": "boolean"})

_TLS_CONFIG = _object(
    [],
    ca=_object([], secret=_SECRET_KEY, configMap=_SECRET_KEY),
    cert=_object([], secret=_SECRET_KEY, configMap=_SECRET_KEY),
    keySecret=_SECRET_KEY,
    serverName=_STRING,
    insecureSkipVerify={"type": "boolean"},
)

_NAMESPACE_SELECTOR = _object(
    [], any={"type": "boolean"}, matchNames={"type": "array", "items": _NAME}
)

_ISSUER_REF = _object(
    ["name"], name=_NAME, kind={"enum": ["Issuer", "ClusterIssuer"]}, group=_STRING
)

_PRIVATE_KEY = _object(
    [],
    algorithm={"enum": ["RSA", "ECDSA", "Ed25519"]},
    encoding={"enum": ["PKCS1", "PKCS8"]},
    rotationPolicy={"enum": ["Never", "Always"]},
    size={"type": "integer"},
)


def _resource(api_version: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return _object(
        ["apiVersion", "kind", "metadata", "spec"],
        apiVersion={"const": api_version},
        kind={"const": kind},
        metadata=_METADATA,
        spec=spec,
    )


SCHEMAS: dict[tuple[str, str], dict[str, Any]] = {
    ("cert-manager.io/v1", "Issuer"): _resource(
        "cert-manager.io/v1",
        "Issuer",
        {
            **_object(
                [],
                selfSigned=_object([], crlDistributionPoints={"type": "array"}),
                ca=_object(["secretName"], secretName=_NAME),
            ),
            # An Issuer is exactly one kind of issuer.
            "minProperties": 1,
            "maxProperties": 1,
        },
    ),
    ("cert-manager.io/v1", "Certificate"): _resource(
        "cert-manager.io/v1",
        "Certificate",
        _object(
            ["secretName", "issuerRef"],
            secretName=_NAME,
            issuerRef=_ISSUER_REF,
            commonName=_STRING,
            dnsNames={"type": "array", "items": _STRING, "minItems": 1},
            duration=_DURATION,
            renewBefore=_DURATION,
            isCA={"type": "boolean"},
            privateKey=_PRIVATE_KEY,
            usages={"type": "array", "items": _STRING},
        ),
    ),
    ("monitoring.coreos.com/v1", "ServiceMonitor"): _resource(
        "monitoring.coreos.com/v1",
        "ServiceMonitor",
        _object(
            ["selector", "endpoints"],
            selector=_LABEL_SELECTOR,
            namespaceSelector=_NAMESPACE_SELECTOR,
            jobLabel=_STRING,
            endpoints={
                "type": "array",
                "minItems": 1,
                "items": _object(
                    [],
                    port=_STRING,
                    path=_STRING,
                    scheme={"enum": ["http", "https"]},
                    interval=_DURATION,
                    scrapeTimeout=_DURATION,
                    tlsConfig=_TLS_CONFIG,
                ),
            },
        ),
    ),
    ("monitoring.coreos.com/v1", "PodMonitor"): _resource(
        "monitoring.coreos.com/v1",
        "PodMonitor",
        _object(
            ["selector", "podMetricsEndpoints"],
            selector=_LABEL_SELECTOR,
            namespaceSelector=_NAMESPACE_SELECTOR,
            jobLabel=_STRING,
            podMetricsEndpoints={
                "type": "array",
                "minItems": 1,
                "items": _object(
                    [],
                    port=_STRING,
                    path=_STRING,
                    scheme={"enum": ["http", "https"]},
                    interval=_DURATION,
                    scrapeTimeout=_DURATION,
                ),
            },
        ),
    ),
    ("monitoring.coreos.com/v1", "PrometheusRule"): _resource(
        "monitoring.coreos.com/v1",
        "PrometheusRule",
        _object(
            ["groups"],
            groups={
                "type": "array",
                "minItems": 1,
                "items": _object(
                    ["name", "rules"],
                    name=_STRING,
                    interval=_DURATION,
                    rules={
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            **_object(
                                ["expr"],
                                alert=_STRING,
                                record=_STRING,
                                expr={"type": "string", "minLength": 1},
                                # The operator's CRD: a duration, 0 allowed.
                                **{"for": _DURATION, "keep_firing_for": _DURATION},
                                labels=_STRING_MAP,
                                annotations=_STRING_MAP,
                            ),
                            # A rule is an alert or a recording rule, never both.
                            "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                        },
                    },
                ),
            },
        ),
    ),
}


def validate_custom(document: Mapping[str, Any]) -> None:
    """Validate a custom resource against its structural schema (KeyError: unknown kind)."""
    schema = SCHEMAS[(document["apiVersion"], document["kind"])]
    jsonschema.Draft7Validator(schema).validate(dict(document))
