#!/bin/bash
# Runs in the e2e Job's app container (stock image python:3.12, which has GNU wget):
# downloads $E2E_URL once with wget and once with Python's urllib. Neither client is
# told about the sidecar: the injector's proxy variables and CA bundle do it all.
set -euo pipefail
wget --quiet --output-document /tmp/first "$E2E_URL"
echo "wget: $(wc -c < /tmp/first) bytes"
exec python3 /e2e/fetch_again.py /tmp/first
