"""Which weights are random: the marker ``cascade make-tiny`` writes into every format it makes.

One marker, ``"model_name": "cascade-tiny-random"``, in the JSON file each format owns: a Laya
checkpoint's ``rl_agent_config.json``, a Clef release's ``joint_head_config.json``, and a Laya
ONNX export's ``export.json`` (fp32 or int8; copied from its checkpoint when exported). A Clef
release that ``make-tiny`` wrote before the marker existed is known by its head config, the tiny
shape exactly. ``label`` and ``banner`` are how the commands that run or measure tiers (eval,
calibrate, distill, route, bench) say so. Imports nothing of cascade (every layer may use it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

DEMO_WARNING = "DEMO: tiny random weights, answers are meaningless"
MARKER = {"model_name": "cascade-tiny-random"}
FILES = ("rl_agent_config.json", "joint_head_config.json", "export.json")
# The head config of a tiny Clef release (cascade.clef.tiny.HEAD) as written before the marker.
_OLD_TINY_HEAD = {"hidden_size": 64, "width": 32, "routing_layers": 1, "layers": 1, "heads": 2,
                  "feedforward": 64}


def random_weights(path: Path | str) -> bool:
    """Whether the checkpoint, release or export directory at ``path`` holds random weights."""
    for name in FILES:
        found = _read(Path(path) / name)
        if found is not None and (MARKER.items() <= found.items() or found == _OLD_TINY_HEAD):
            return True
    return False


def _read(file: Path) -> dict[str, Any] | None:
    try:
        found = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def label(tiers: list[str]) -> dict[str, Any]:
    """The fields a JSON output carries when ``tiers`` (random ones) is not empty."""
    return {"demo": True, "random_tiers": tiers, "warning": DEMO_WARNING} if tiers else {}


def banner(command: str, tiers: list[str]) -> None:
    """Say on stderr which tiers serve random weights (nothing when none does)."""
    if tiers:
        print(f"cascade {command}: DEMO: tiny RANDOM weights ({', '.join(tiers)}); the "
              "figures mean nothing", file=sys.stderr)
