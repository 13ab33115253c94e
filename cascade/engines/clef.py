"""``ClefEngine``: the Clef-flash tier, in process, batching concurrent requests on one device.

Request path: the event loop hands the call to a helper thread that tokenizes it and runs the
image processor (``PromptEncoder``, ``ImageEncoder``), checks the over-long policy and the
memory budget, then submits one ``Job`` to the ``MicroBatcher``, whose single worker thread
owns the model (``ClefRunner.run_batch``). torch and transformers are imported only when the
engine starts, so the gateway imports this module without them.

Errors: ``TokensExceeded`` (over-long in reject mode, or a schema that cannot fit),
``MemoryBudgetExceeded`` (a ``PayloadTooLarge``), ``ValidationFailed`` (an image the processor
cannot take: the client's content, never a tier failure), ``Overloaded`` (queue full, or the
measured work ahead would keep the call past its budget's deadline), ``EngineUnavailable`` (not
started, closed, release missing), ``EngineFailed`` (a forward failed, or the image processor
raised something other than a refusal: a bug, never answered as the client's mistake).
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any, Literal

from cascade.calls import EngineAnswer, EngineCall, EngineUsage, QuestionResult
from cascade.errors import CascadeError, EngineFailed, EngineUnavailable

WARMUP_STATE = "warm-up"
# A device batch stops growing past this much predicted compute (every request in it waits for
# all of it; on a GPU the token budget binds first), or once padding would be over half of it
# (a padded token costs what a real one does).
MAX_BATCH_S = 2.0
MAX_PAD_FRACTION = 0.5


class ClefEngine:
    """Implements ``cascade.engines.base.Engine`` for a Clef release directory or hub id."""

    def __init__(
        self,
        name: str,
        release: Path,
        *,
        device: str = "auto",
        demo: bool = False,
        max_length: int = 16384,
        overlong: Literal["reject", "truncate"] = "reject",
        max_batch_tokens: int = 32768,
        max_batch_requests: int = 8,
        max_wait_s: float = 0.005,
        max_queue: int = 64,
        memory_budget_bytes: int | None = None,
    ) -> None:
        if overlong not in ("reject", "truncate"):
            raise ValueError(f"overlong must be 'reject' or 'truncate', not {overlong!r}")
        self.name = name
        self.release = release
        self.device = device
        self.demo = demo
        self.max_length = max_length
        self.overlong = overlong
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_requests = max_batch_requests
        self.max_wait_s = max_wait_s
        self.max_queue = max_queue
        self.memory_budget_bytes = memory_budget_bytes
        self._ready = False
        self._parts: Any = None  # _Loaded, once started
        self._batcher: Any = None

    async def start(self) -> None:
        """Load (bf16 on CUDA, fp32 on CPU), warm up with one forward; ``ready()`` after."""
        from cascade.engines.batcher import MicroBatcher

        self._parts = await asyncio.to_thread(self._load)
        runner = self._parts.runner
        self._batcher = MicroBatcher(
            runner.run_batch,
            name=self.name,
            max_batch_items=self.max_batch_requests,
            max_batch_cost=self.max_batch_tokens,
            cost=lambda job: job.length,
            max_wait_s=self.max_wait_s,
            max_queue=self.max_queue,
            sort_key=lambda job: job.length,
            calibration=self._parts.calibration,
            max_batch_s=MAX_BATCH_S,
            max_pad_fraction=MAX_PAD_FRACTION,
        )
        self._ready = True

    def _load(self) -> _Loaded:
        from cascade.clef import release as rel
        from cascade.clef.media import ImageEncoder
        from cascade.clef.prompt import PromptEncoder, locked_tokenize
        from cascade.clef.runner import ClefRunner, Job
        from cascade.schema import NoulQuestion

        loaded = rel.load(rel.resolve_release(self.release), self.device)
        if loaded.device.type == "cpu":
            # transformers warns that Qwen3.5's linear attention falls back to its reference
            # path without the fused kernels it names; those kernels are CUDA-only, so on the
            # CPU the reference path is the only one and the warning says nothing.
            logging.getLogger("transformers.integrations.hub_kernels").setLevel(logging.ERROR)
        tokenizer = loaded.tokenizer
        tokenize_batch = locked_tokenize(tokenizer)

        encoder = PromptEncoder(tokenize_batch, max_length=self.max_length, overlong=self.overlong)
        images = ImageEncoder(
            loaded.path,
            lambda text: tokenize_batch([text])[0],
            tokenizer.convert_tokens_to_ids("<|image_pad|>"),
        )
        budget = self.memory_budget_bytes
        if budget is None and loaded.device.type == "cuda":
            import torch

            budget = int(torch.cuda.mem_get_info(loaded.device)[0] * 0.85)
        runner = ClefRunner(
            loaded, max_batch_tokens=self.max_batch_tokens, memory_budget_bytes=budget
        )
        warm = Job(encoder.encode(WARMUP_STATE, {"warm": NoulQuestion()}))
        runner.forward([warm])  # the first forward warms up: not timed
        calibration = []  # ([tokens], seconds): the batcher's first data on costs
        for words in (0, 256, 1024):  # short, medium, long: fixed, linear and square costs
            state = WARMUP_STATE + " ok" * words
            if encoder.count(state, {"warm": NoulQuestion()}) > self.max_length:
                break
            job = Job(encoder.encode(state, {"warm": NoulQuestion()}))
            started = time.perf_counter()
            runner.forward([job])
            calibration.append(([job.length], time.perf_counter() - started))
        return _Loaded(loaded, encoder, images, runner, calibration)

    def _require(self) -> _Loaded:
        if not self._ready:
            raise EngineUnavailable(f"engine {self.name!r} is not started")
        return self._parts

    def count_tokens(self, call: EngineCall) -> int:
        """Exact prompt tokens (media included) before any truncation; no inference."""
        parts = self._require()
        return parts.encoder.count(call.state, call.questions, parts.images.count(call.images))

    async def answer(self, call: EngineCall) -> EngineAnswer:
        parts = self._require()
        batcher = self._batcher  # aclose() may clear the attributes while this call waits
        budget = call.budget
        flow, deadline = (budget.flow, budget.deadline) if budget else (None, None)
        batcher.check(flow=flow, deadline=deadline)  # refuse before tokenizing, not after
        job = await asyncio.to_thread(parts.prepare, call)
        (outcome,) = await batcher.submit([job], flow=flow, deadline=deadline)
        if isinstance(outcome, Exception):
            raise outcome
        encoded = job.encoded
        results = {
            q.question_id: QuestionResult(
                type=call.questions[q.question_id].type, probabilities=probs
            )
            for q, probs in zip(encoded.questions, outcome, strict=True)
        }
        # Every question reads the one shared state, so a cut state truncates each of them.
        truncated = list(call.questions) if encoded.state_dropped else []
        usage = EngineUsage(
            input_tokens=len(encoded.input_ids),
            state_tokens=encoded.state_tokens,
            state_tokens_dropped=encoded.state_dropped,
            truncated_questions=truncated,
        )
        return EngineAnswer(model=parts.model_name, results=results, usage=usage)

    def ready(self) -> bool:
        return self._ready

    def expected_wait(self) -> float:
        """Seconds the work queued and in flight would keep a new request waiting (``Waiting``)."""
        batcher = self._batcher
        return batcher.expected_wait(time.monotonic()) if batcher is not None else 0.0

    def health(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "engine": "clef",
            "name": self.name,
            "release": str(self.release),
            "ready": self._ready,
            "demo": self.demo,
            "max_length": self.max_length,
            "overlong": self.overlong,
            "max_batch_tokens": self.max_batch_tokens,
            "max_batch_requests": self.max_batch_requests,
        }
        if self._ready:
            parts = self._parts
            info.update(
                model=parts.model_name,
                revision=parts.revision,
                device=str(parts.release.device),
                dtype=str(parts.release.dtype).removeprefix("torch."),
                memory_budget_bytes=parts.runner.memory_budget_bytes,
                queue_depth=self._batcher.queue_depth(),
            )
        return info

    async def aclose(self) -> None:
        self._ready = False
        if self._batcher is not None:
            await self._batcher.aclose()
        self._batcher = self._parts = None


class _Loaded:
    """Everything ``start`` builds; ``prepare`` runs in helper threads, never on the loop."""

    def __init__(
        self,
        release: Any,
        encoder: Any,
        images: Any,
        runner: Any,
        calibration: list[tuple[list[int], float]],
    ) -> None:
        self.release, self.encoder, self.images, self.runner = release, encoder, images, runner
        self.calibration = calibration
        path = release.path
        hub = path.parent.parent.name if path.parent.name == "snapshots" else ""
        # Hub cache layout: models--Cloudflare--clef-flash/snapshots/<revision>
        self.model_name = hub.split("--")[-1] if hub.startswith("models--") else path.name
        self.revision = path.name if hub else None

    def prepare(self, call: EngineCall) -> Any:
        from cascade.clef.runner import Job

        try:
            # Content the image processor refuses is a ValidationFailed from ``clef.media``;
            # anything else it raises is this tier's bug, never the client's mistake.
            media = self.images.encode(call.images)
        except CascadeError:
            raise
        except Exception as exc:
            raise EngineFailed(f"the Clef image processor failed: {exc!r}") from exc
        encoded = self.encoder.encode(
            call.state, call.questions, media.input_ids if media is not None else ()
        )
        self.runner.check_fits(len(encoded.input_ids))
        return Job(encoded, media)
