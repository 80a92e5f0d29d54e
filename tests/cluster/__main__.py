"""`python -m tests.cluster up|down|prepare`: the one-node cluster of `make cluster`.

`prepare` builds the binaries and images a cluster needs without starting one (what
`make test` does first, so that no test waits half an hour for a first build); on a
machine that cannot run the cluster it says why and succeeds (its tests are skipped).
"""

from __future__ import annotations

import argparse
import sys

from tests.cluster.build import BuildUnavailable, build
from tests.cluster.cluster import ClusterUnavailable, down, preflight, up
from tests.cluster.images import prepare_images


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster", description=__doc__)
    parser.add_argument("action", choices=("up", "down", "prepare"))
    action = parser.parse_args().action
    try:
        if action == "prepare":
            preflight()
            print("building the cluster's binaries (the first time: about 25 minutes)")
            build()
            prepare_images()
        else:
            up() if action == "up" else down()
    except (ClusterUnavailable, BuildUnavailable) as e:
        print(f"{'warning' if action == 'prepare' else 'error'}: the cluster cannot run here: {e}",
              file=sys.stderr)  # fmt: skip
        return 0 if action == "prepare" else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
