"""The figures of docs/live-control.md's "The fleet": three ``cascade serve --policy`` replicas
on one ``redis-server`` with ``CASCADE_WATCH_S=1``; how long a ConfigMap swap takes to be served
by all three, and a fleet reload's round trip. Not a test (it only measures):

    python -m tests.fleet.measure [SWAPS] [RELOADS]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from cascade.policy.files import load_policy
from cascade.policy.fingerprint import policy_hash
from tests.fleet.configmap import ConfigMap
from tests.fleet.test_replicas import ADMIN, NAMES, fleet, fleet_view, serving, until
from tests.http.test_reload import policy_text


def main(swaps: int = 5, reloads: int = 20) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        volumes = {n: ConfigMap(Path(tmp) / n, {"policy.toml": policy_text(0.0)}) for n in NAMES}
        with fleet(
            {n: v.path("policy.toml") for n, v in volumes.items()}, CASCADE_WATCH_S="1"
        ) as up:
            bases = {n: base for n, (base, _) in up.items()}
            assert until(lambda: len(fleet_view(bases["a"])["replicas"]) == 3)
            taken = []
            for i in range(swaps):
                for volume in volumes.values():
                    volume.update({"policy.toml": policy_text((1.0, 0.5)[i % 2])})
                new = policy_hash(load_policy(volumes["a"].path("policy.toml")))
                start = time.monotonic()
                assert until(lambda new=new: all(serving(b) == new for b in bases.values()))
                taken.append(time.monotonic() - start)
            trips = []
            for _ in range(reloads):
                start = time.monotonic()
                answer = httpx.post(
                    bases["a"] + "/admin/reload?scope=fleet", headers=ADMIN, timeout=30
                )
                trips.append(time.monotonic() - start)
                assert answer.status_code == 200 and len(answer.json()["replicas"]) == 3
    print(
        f"ConfigMap swap served by all 3: median {statistics.median(taken):.2f} s, "
        f"{min(taken):.2f}-{max(taken):.2f} s over {swaps}"
    )
    print(
        f"fleet reload round trip: median {statistics.median(trips) * 1000:.0f} ms, "
        f"max {max(trips) * 1000:.0f} ms over {reloads}"
    )


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
