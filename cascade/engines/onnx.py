"""An onnxruntime session that runs whole batches; synchronous, no asyncio.

``OnnxSession`` owns one ``InferenceSession``. Its ``run`` is called from one worker thread (the
batcher's); onnxruntime errors are re-raised as ``EngineFailed`` so only ``cascade.errors``
exceptions leave the engine.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnxruntime as ort

from cascade.errors import EngineFailed, EngineUnavailable


def default_threads() -> int:
    """Cores this process may run on (affinity, not the machine's total)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class OnnxSession:
    """One CPU ``InferenceSession`` with full graph optimisation and explicit thread counts.

    ``intra_op_threads`` defaults to the cores available; inter-op parallelism is off (the
    graph is a chain). ``spin`` keeps idle intra-op threads spinning between runs: lower latency
    under load, wasted CPU when idle, so it is off unless asked for. ``optional``: outputs run
    too when the graph has them (after ``outputs``).
    """

    def __init__(
        self,
        path: Path,
        *,
        intra_op_threads: int | None = None,
        spin: bool = False,
        outputs: tuple[str, ...] = ("logits", "act_logits"),
        optional: tuple[str, ...] = (),
    ) -> None:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.intra_op_num_threads = intra_op_threads or default_threads()
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
        self.threads = options.intra_op_num_threads
        self.outputs = list(outputs)
        try:
            self._session = ort.InferenceSession(
                str(path), options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # onnxruntime raises its own untyped errors
            raise EngineUnavailable(f"cannot load {path}: {exc}") from exc
        has = {o.name for o in self._session.get_outputs()}
        self.outputs += [name for name in optional if name in has]

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """One forward pass over a collated batch; outputs in ``self.outputs`` order."""
        try:
            return self._session.run(self.outputs, dict(feeds))
        except Exception as exc:
            raise EngineFailed(f"onnxruntime failed: {exc}") from exc
