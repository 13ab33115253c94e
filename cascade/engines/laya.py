"""``LayaEngine``: Laya checkpoints on onnxruntime behind the ``Engine`` protocol.

Per configured checkpoint: one ONNX export (fp32: made on first start in a child process when not
cached, so the serving process never imports torch; int8: made ahead of time by ``cascade export
laya DIR --precision int8``, never at start, since the flip gate must have passed it), one
``OnnxSession`` and one
``MicroBatcher`` whose single worker thread runs the session. ``answer`` validates and assembles
rows off the event loop (``Previewer.plan``), submits them to the checkpoint's batcher, and
decodes unrounded probabilities in the caller's option order.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypedDict

from cascade.calls import CallPreview, EngineAnswer, EngineCall
from cascade.engines.batcher import MicroBatcher
from cascade.engines.onnx import OnnxSession
from cascade.errors import EngineUnavailable, install_hint
from cascade.laya import decode
from cascade.laya.checkpoint import content_hash
from cascade.laya.decode import RowOut
from cascade.laya.export import MODEL_FILE, cache_root, cached_export
from cascade.laya.int8 import cached_int8
from cascade.laya.preview import Plan, Previewer
from cascade.laya.rows import Row, collate

log = logging.getLogger(__name__)
# On a CPU a padded token costs as much as a real one and batching barely raises GEMM
# efficiency, so rows are batched only while padding stays under this share of the batch.
MAX_PAD_FRACTION = 0.2
# ... and a batch stops growing past this much predicted compute: every row waits for the whole
# batch, so on a CPU a big batch only adds latency.
MAX_BATCH_S = 0.5
# Lengths of the timed warm-up rows: enough spread to tell a row's fixed cost, its cost per token
# and the part that grows with its square apart.
WARMUP_TOKENS = (16, 128, 512)


def export_in_child(ckpt: Path, cache: Path) -> Path:
    """Export ``ckpt`` with ``cascade export laya`` in a child process; progress goes to the log."""
    target = cache / content_hash(ckpt)[:16]
    log.info("laya: no ONNX export of %s in %s; exporting (needs the export extra)", ckpt, cache)
    cmd = [sys.executable, "-m", "cascade", "export", "laya", str(ckpt), "--out", str(target)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line.rstrip())
        log.info("%s", line.rstrip())
    if proc.wait() != 0:
        tail = "\n".join(lines[-5:])
        raise EngineUnavailable(
            f"ONNX export of {ckpt} failed ({install_hint('export')}, or run "
            f"`cascade export laya {ckpt} --out {target}` where torch is available):\n{tail}"
        )
    return target


def warmup_row(cls_id: int, mask_id: int, sep_id: int, tokens: int) -> Row:
    """A one-option noul-shaped row of ``tokens`` ids: what start-up runs and times."""
    filler = [sep_id] * max(0, tokens - 3)
    return Row(
        ids=[cls_id, *filler, mask_id, sep_id],
        markers=[len(filler) + 1],
        qtype=2,
        distinct=1,
        tokens_per_option=None,
        state_used=0,
    )


def calibrate(session: OnnxSession, pad_id: int, rows: list[Row]) -> list[tuple[list[int], float]]:
    """``([tokens], seconds)`` of one run per row after a first, untimed warm-up run: the
    batcher's first data on what a row of each length costs."""
    run_rows(session, pad_id, rows[:1])
    timed = []
    for row in rows:
        started = time.perf_counter()
        run_rows(session, pad_id, [row])
        timed.append(([len(row.ids)], time.perf_counter() - started))
    return timed


class _Limits(TypedDict):
    """The batcher limits every checkpoint of one engine shares."""

    max_batch_items: int
    max_batch_cost: int
    max_wait_s: float
    max_queue: int


def run_rows(session: OnnxSession, pad_id: int, rows: list[Row]) -> list[RowOut]:
    """One forward pass over ``rows``; each output trimmed to that row's own options."""
    logits, act, *pooled = session.run(collate(rows, pad_id))
    return [
        (logits[i, : len(r.markers)].copy(), act[i].copy(), pooled[0][i].copy() if pooled else None)
        for i, r in enumerate(rows)
    ]


class LayaEngine:
    """Implements ``cascade.engines.base.Engine`` for one or more Laya checkpoints."""

    independent_questions = True  # one row per question: see cascade.engines.base.Engine

    def __init__(
        self,
        name: str,
        checkpoints: Mapping[str, Path],
        *,
        demo: bool = False,
        onnx_cache: Path | None = None,
        intra_op_threads: int | None = None,
        max_batch_rows: int = 32,
        max_batch_tokens: int = 16384,
        max_wait_s: float = 0.002,
        max_queue_rows: int = 1024,
        default_checkpoint: str | None = None,
        precision: Literal["fp32", "int8"] = "fp32",
    ) -> None:
        self.name = name
        self.precision = precision
        self.demo = demo
        self.previewer = Previewer(checkpoints, default=default_checkpoint)
        self._cache = onnx_cache or cache_root()
        self._threads = intra_op_threads
        self._limits = _Limits(
            max_batch_items=max_batch_rows,
            max_batch_cost=max_batch_tokens,
            max_wait_s=max_wait_s,
            max_queue=max_queue_rows,
        )
        self._batchers: dict[str, MicroBatcher[Row, RowOut]] = {}
        self._exports: dict[str, Path] = {}

    async def start(self) -> None:
        """Export (first start only), load a session per checkpoint and warm each one up."""
        if self.demo:
            log.warning("laya: DEMO mode, tiny RANDOM checkpoints: answers mean nothing")
        for name, ckpt in self.previewer.checkpoints.items():
            export = await asyncio.to_thread(self._export, ckpt.path)
            session = await asyncio.to_thread(
                OnnxSession,
                export / MODEL_FILE,
                intra_op_threads=self._threads,
                optional=("pooled",),
            )
            tok = ckpt.tok
            rows = [
                warmup_row(tok.cls_id, tok.mask_id, tok.sep_id, min(n, ckpt.cfg.max_len))
                for n in WARMUP_TOKENS
            ]
            timed = await asyncio.to_thread(calibrate, session, tok.pad_id, rows)
            self._exports[name] = export
            self._batchers[name] = MicroBatcher(
                functools.partial(run_rows, session, tok.pad_id),
                name=f"{self.name}/{name}",
                cost=lambda r: len(r.ids),
                sort_key=lambda r: len(r.ids),
                max_pad_fraction=MAX_PAD_FRACTION,
                calibration=timed,
                max_batch_s=MAX_BATCH_S,
                **self._limits,
            )
            log.info(
                "laya: %s ready (%s, %s, %d threads)", name, self.precision, export, session.threads
            )

    def _export(self, ckpt: Path) -> Path:
        """The export this engine serves for ``ckpt`` (the fp32 one is made when missing)."""
        if self.precision == "int8":
            found = cached_int8(ckpt, self._cache)
            if found is None:
                raise EngineUnavailable(
                    f"no int8 export of {ckpt} in {self._cache}: run "
                    f"`cascade export laya {ckpt} --precision int8 --check "
                    "DATA.jsonl`"
                )
            return found
        return cached_export(ckpt, self._cache) or export_in_child(ckpt, self._cache)

    def preview(self, call: EngineCall, *, checkpoint: str | None = None) -> CallPreview:
        return self.previewer.preview(call, checkpoint=checkpoint)

    def _model_name(self, checkpoint: str) -> str:
        return f"{checkpoint}-demo-random" if self.demo else checkpoint

    async def answer(self, call: EngineCall) -> EngineAnswer:
        if not self.ready():
            raise EngineUnavailable(f"{self.name}: not started")
        budget = call.budget
        flow, deadline = (budget.flow, budget.deadline) if budget else (None, None)
        # Refuse before tokenizing when the default checkpoint's queue is too long already.
        self._batchers[self.previewer.default].check(flow=flow, deadline=deadline)
        plan: Plan = await asyncio.to_thread(self.previewer.plan, call)
        batcher = self._batchers.get(plan.checkpoint)
        if batcher is None:  # closed while the rows were being planned
            raise EngineUnavailable(f"{self.name}: closed")
        outputs = await batcher.submit(plan.rows, flow=flow, deadline=deadline)
        cfg = self.previewer.checkpoints[plan.checkpoint].cfg
        return EngineAnswer(
            model=self._model_name(plan.checkpoint),
            results=decode.results(plan.questions, plan.rows, outputs, cfg),
            usage=decode.usage(plan.questions, plan.rows, plan.state_tokens),
        )

    def ready(self) -> bool:
        return len(self._batchers) == len(self.previewer.checkpoints)

    def health(self) -> dict[str, Any]:
        return {
            "engine": "laya-onnx",
            "demo": self.demo,
            "precision": self.precision,
            "ready": self.ready(),
            "default_checkpoint": self.previewer.default,
            "checkpoints": {
                name: {
                    "path": str(ckpt.path),
                    "onnx": str(self._exports.get(name, "")),
                    "queue_depth": b.queue_depth() if (b := self._batchers.get(name)) else 0,
                    "dropped_rows": b.dropped_rows if b else 0,
                    "batches": b.batches if b else 0,
                }
                for name, ckpt in self.previewer.checkpoints.items()
            },
        }

    async def aclose(self) -> None:
        for batcher in self._batchers.values():
            await batcher.aclose()
        self._batchers.clear()
