"""Second download of the e2e Job, with Python's urllib, then the sidecar's verdict.

Run inside the Job's app container after wget fetched the same URL: downloads it again
(through the injected proxy, trusting the pod's CA bundle, as any unmodified program
would), checks both copies are identical, then reads the sidecar's /stats on the pod IP
and prints one line the e2e script asserts on:
`BURSTBUFFER_E2E hits=<n> misses=<n>`. Exits 1 unless the second download was a hit.
"""

import json
import os
import sys
import urllib.request


def main() -> int:
    url = os.environ["E2E_URL"]
    with open(sys.argv[1], "rb") as f:
        first = f.read()
    with urllib.request.urlopen(url, timeout=300) as response:
        second = response.read()
    print(f"urllib: {len(second)} bytes")
    if second != first:
        print("the two downloads differ", file=sys.stderr)
        return 1
    # The admin endpoints are on the pod IP and must not go through the proxy.
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    stats_url = f"http://{os.environ['POD_IP']}:{os.environ['E2E_ADMIN_PORT']}/stats"
    with direct.open(stats_url, timeout=30) as response:
        stats = json.load(response)
    print("stats:", json.dumps(stats, sort_keys=True))
    print(f"BURSTBUFFER_E2E hits={stats['hits']} misses={stats['misses']}")
    return 0 if stats["hits"] >= 1 and stats["misses"] >= 1 else 1


if __name__ == "__main__":
    sys.exit(main())
