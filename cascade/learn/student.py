"""The student: a Laya checkpoint as a trainable torch graph (``cascade.laya.torch_ref``).

``Student`` loads every tensor in fp32 on the chosen device, marks the trained ones
``requires_grad`` (``all``, or ``head``: everything after the encoder), and computes the
log-probabilities cascade serves for a batch of rows: ``log_softmax(logits / T)`` over each
row's real option slots, ``T`` the engine's temperature for that row. ``round_to_source``
puts every tensor through the source file's dtype (F16/BF16/F32), so figures measured after
it are those of the checkpoint as written.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import torch

from cascade.laya.checkpoint import load_weights, read_header
from cascade.laya.config import load_config
from cascade.laya.rows import collate
from cascade.laya.torch_ref import TorchLaya
from cascade.learn.dataset import Example

Trained = Literal["all", "head"]
TORCH_DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32}


def device_for(choice: str) -> torch.device:
    """``auto``: CUDA when present, else the CPU."""
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(choice)


def cpu_threads(hidden: int) -> int:
    """Threads worth using on a CPU: one per 256 hidden units, at most the cores this process
    may run on. Small matrices gain nothing from threads, and on a shared machine each extra
    thread costs several times what it saves (measured: a tiny checkpoint's training step
    runs 5-15x faster on one thread than on two busy cores)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(cores or 1, hidden // 256))


class Student:
    """One checkpoint's weights on ``device``; not thread-safe."""

    def __init__(
        self, ckpt: Path, pad_id: int, *, device: torch.device, train: Trained = "all"
    ) -> None:
        cfg = load_config(ckpt)
        header, _ = read_header(ckpt / "model.safetensors")
        self.dtypes = {name: TORCH_DTYPES[info["dtype"]] for name, info in header.items()}
        self.model = TorchLaya(cfg, load_weights(ckpt, cfg)).to(device)
        self.pad_id = pad_id
        self.device = device
        self.trained = {
            name: t
            for name, t in self.model.tensors().items()
            if train == "all" or not name.startswith("encoder.")
        }
        for name, tensor in self.model.tensors().items():
            tensor.requires_grad_(name in self.trained)

    def log_probs(self, batch: Sequence[Example]) -> tuple[torch.Tensor, torch.Tensor]:
        """Served log-probabilities ``[rows, slots]`` and the mask of real slots."""
        feeds = {
            k: torch.from_numpy(v).to(self.device)
            for k, v in collate([e.row for e in batch], self.pad_id).items()
        }
        logits, _ = self.model.logits(feeds)
        temps = torch.tensor([e.temperature for e in batch], device=self.device)[:, None]
        mask = feeds["marker_mask"]
        scaled = (logits / temps).masked_fill(~mask, -torch.inf)
        return torch.log_softmax(scaled, -1).masked_fill(~mask, 0.0), mask

    @torch.no_grad()
    def round_to_source(self) -> None:
        """Round every tensor through its dtype in the source file, in place."""
        for name, tensor in self.model.tensors().items():
            tensor.copy_(tensor.to(self.dtypes[name]).to(tensor.dtype))

    def state(self, *, as_source: bool = False) -> dict[str, torch.Tensor]:
        """Every tensor on the CPU under its checkpoint name: fp32 copies, or in the source
        file's dtypes (``as_source``)."""
        return {
            name: t.detach()
            .to("cpu", self.dtypes[name] if as_source else torch.float32, copy=True)
            .contiguous()
            for name, t in self.model.tensors().items()
        }

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for name, tensor in self.model.tensors().items():
                tensor.copy_(state[name])
