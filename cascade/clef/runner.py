"""The Clef model runner: one synchronous ``run_batch`` that owns the device.

``run_batch(jobs)`` is what the micro-batcher calls from its single worker thread. It splits
the jobs into device batches (text-only and image jobs apart, so text rows take the
reference's text-only path; sorted by length; each batch within the token and memory
budgets), right-pads them (the Gated DeltaNet layers and the head both need right padding),
runs the backbone and the batched head, and returns per-question probabilities in the
caller's order. A job that cannot run comes back as an exception object in its slot, so one
bad job never fails its neighbours.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cascade.clef.media import MediaInputs
from cascade.clef.prompt import Encoded
from cascade.clef.release import Release
from cascade.errors import EngineFailed, PayloadTooLarge

Probabilities = list[list[float]]  # per question, caller's order


class MemoryBudgetExceeded(PayloadTooLarge):
    """A request that would not fit the engine's memory budget even alone."""

    error_type = "memory_budget_exceeded"


@dataclass(frozen=True)
class Job:
    encoded: Encoded
    media: MediaInputs | None = None

    @property
    def length(self) -> int:
        return len(self.encoded.input_ids)


class ClefRunner:
    """Owns a loaded ``Release``. Not thread-safe: call ``run_batch`` from one thread."""

    def __init__(
        self,
        release: Release,
        *,
        max_batch_tokens: int = 32768,
        memory_budget_bytes: int | None = None,
    ) -> None:
        self.release = release
        self.max_batch_tokens = max_batch_tokens
        self.memory_budget_bytes = memory_budget_bytes
        text = release.backbone.config.text_config
        linear = 2 * text.linear_num_key_heads * text.linear_key_head_dim + (
            text.linear_num_value_heads * text.linear_value_head_dim
        )
        width = release.head.memory_projection.out_features
        dtype_bytes = release.dtype.itemsize
        # Live activations per token during one layer of the prefill (hidden stream, norms,
        # MLP gate/up, GDN projections), the fp32 working copies of the chunked delta rule
        # (torch fallback), and the fp32 head's normed states and memory rows.
        values = text.linear_num_value_heads * text.linear_value_head_dim
        self._per_token = (
            dtype_bytes * (8 * text.hidden_size + 3 * text.intermediate_size + 3 * linear)
            + 4 * 8 * values
            + 4 * (3 * text.hidden_size + 4 * width)
        )
        self._mask_bytes = dtype_bytes  # the full-attention layers' [B, 1, L, L] padding mask

    def estimate_bytes(self, rows: int, length: int) -> int:
        """Transient device memory for a right-padded batch of ``rows`` x ``length`` tokens."""
        return rows * length * self._per_token + rows * length * length * self._mask_bytes

    def check_fits(self, length: int) -> None:
        """Raise ``MemoryBudgetExceeded`` when one ``length``-token job exceeds the budget."""
        budget = self.memory_budget_bytes
        if budget is not None and self.estimate_bytes(1, length) > budget:
            raise MemoryBudgetExceeded(
                f"a {length}-token Clef request needs about {self.estimate_bytes(1, length)} "
                f"bytes of device memory; the engine's budget is {budget} bytes"
            )

    def run_batch(self, jobs: Sequence[Job]) -> list[Probabilities | Exception]:
        """One outcome per job, in order: probabilities, or the error for that job alone."""
        outcomes: dict[int, Probabilities | Exception] = {}
        for group in self._plan(jobs):
            outcomes.update(zip(group, self._run_guarded([jobs[i] for i in group]), strict=True))
        return [outcomes[i] for i in range(len(jobs))]

    def _plan(self, jobs: Sequence[Job]) -> list[list[int]]:
        """Indices per device batch: same kind, sorted by length, within both budgets."""
        batches: list[list[int]] = []
        for media in (False, True):
            order = sorted(
                (i for i, j in enumerate(jobs) if (j.media is not None) == media),
                key=lambda i: jobs[i].length,
            )
            current: list[int] = []
            for i in order:
                rows, length = len(current) + 1, jobs[i].length  # sorted: i is the longest
                if current and not self._fits(rows, length):
                    batches.append(current)
                    current = []
                current.append(i)
            if current:
                batches.append(current)
        return batches

    def _fits(self, rows: int, length: int) -> bool:
        budget = self.memory_budget_bytes
        return rows * length <= self.max_batch_tokens and (
            budget is None or self.estimate_bytes(rows, length) <= budget
        )

    def _run_guarded(self, jobs: list[Job]) -> list[Probabilities | Exception]:
        import torch

        try:
            return list(self.forward(jobs))
        except torch.OutOfMemoryError:
            if self.release.device.type == "cuda":
                torch.cuda.empty_cache()
            if len(jobs) > 1:  # retry one by one: only the job that cannot fit fails
                return [outcome for job in jobs for outcome in self._run_guarded([job])]
            return [
                MemoryBudgetExceeded(
                    f"a {jobs[0].length}-token Clef request ran out of device memory"
                )
            ]
        except (RuntimeError, ValueError) as exc:
            return [EngineFailed(f"Clef forward failed: {exc}")] * len(jobs)

    def forward(self, jobs: Sequence[Job]) -> list[Probabilities]:
        """One device batch, no budget checks: probabilities per job, caller's order."""
        import torch

        rel = self.release
        length = max(job.length for job in jobs)
        pad = rel.tokenizer.pad_token_id
        ids = torch.full((len(jobs), length), pad, dtype=torch.long)
        mask = torch.zeros((len(jobs), length), dtype=torch.long)
        for row, job in enumerate(jobs):
            ids[row, : job.length] = torch.tensor(job.encoded.input_ids)
            mask[row, : job.length] = 1
        ids, mask = ids.to(rel.device), mask.to(rel.device)
        with torch.inference_mode():
            hidden = self._hidden(ids, mask, jobs)
            logits = rel.head(
                hidden,
                ids,
                mask.sum(-1),
                [job.encoded.questions for job in jobs],
                rel.backbone.get_output_embeddings().weight,
            )
            flat = torch.cat([q for record in logits for q in record]).float().cpu()
        parts = iter(
            torch.split(flat, [len(q.option_ids) for j in jobs for q in j.encoded.questions])
        )
        out = []
        for job in jobs:
            answers = []
            for question in job.encoded.questions:
                probs = next(parts).softmax(-1).tolist()
                answers.append([probs[i] for i in question.caller_order])
            out.append(answers)
        return out

    def _hidden(self, ids: Any, mask: Any, jobs: Sequence[Job]) -> Any:
        """Last hidden states: the text model alone, or the full model when images exist."""
        import torch

        model = self.release.backbone.model
        media = [job.media for job in jobs if job.media is not None]
        if not media:
            return model.language_model(
                input_ids=ids, attention_mask=mask, use_cache=False
            ).last_hidden_state
        types = torch.zeros_like(ids)
        for row, job in enumerate(jobs):
            if job.media is not None:
                start = job.encoded.media_offset
                end = start + len(job.media.mm_token_type_ids)
                types[row, start:end] = torch.tensor(job.media.mm_token_type_ids)
        device = self.release.device
        return model(
            input_ids=ids,
            attention_mask=mask,
            use_cache=False,
            mm_token_type_ids=types,
            pixel_values=torch.cat([m.pixel_values for m in media]).to(device),
            image_grid_thw=torch.cat([m.image_grid_thw for m in media]).to(device),
        ).last_hidden_state
