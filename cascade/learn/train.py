"""The training loop: weighted KL(teacher || student) on the served option distributions.

Adam over the trained tensors, mini-batches shuffled per epoch from ``(seed, epoch)`` alone, a
linear warm-up then a cosine decay of the learning rate, gradients clipped at norm 1. After
every epoch the weights, the optimizer and the losses are saved to ``state_path`` (written
aside, then renamed), so an interrupted run resumes at the next epoch and ends where an
uninterrupted run ends. Deterministic for a given seed, data and device.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

import msgspec
import numpy as np
import torch

from cascade.learn.dataset import Example
from cascade.learn.student import Student, Trained


class TrainConfig(msgspec.Struct, frozen=True, kw_only=True):
    epochs: int = 12
    lr: float = 2e-3
    batch_size: int = 16
    train: Trained = "all"
    seed: int = 0
    warmup: float = 0.1  # share of the steps spent warming up


def kl_loss(student: Student, batch: Sequence[Example]) -> torch.Tensor:
    """Weighted mean over rows of KL(teacher || student), nats."""
    logq, mask = student.log_probs(batch)
    width = logq.shape[1]
    p = torch.tensor(
        [e.teacher + [0.0] * (width - len(e.teacher)) for e in batch], device=logq.device
    )
    w = torch.tensor([e.weight for e in batch], device=logq.device)
    per_row = (torch.xlogy(p, p) - p * logq).masked_fill(~mask, 0.0).sum(-1)
    return (w * per_row).sum() / w.sum()


def _schedule(step: int, total: int, warmup: float) -> float:
    ramp = max(1, round(total * warmup))
    if step < ramp:
        return (step + 1) / ramp
    return 0.5 * (1 + math.cos(math.pi * (step - ramp) / max(1, total - ramp)))


def train(
    student: Student,
    examples: Sequence[Example],
    config: TrainConfig,
    state_path: Path,
    *,
    progress: bool = True,
) -> list[float]:
    """Train in place; returns the mean loss of every epoch (resumed epochs included)."""
    from tqdm import tqdm

    torch.manual_seed(config.seed)
    params = list(student.trained.values())
    optimizer = torch.optim.Adam(params, lr=config.lr)
    steps_per_epoch = math.ceil(len(examples) / config.batch_size)
    total = steps_per_epoch * config.epochs
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: _schedule(s, total, config.warmup)
    )
    losses: list[float] = []
    if state_path.exists():
        saved = torch.load(state_path, weights_only=True)
        student.load_state(saved["tensors"])
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        losses = list(saved["losses"])
    bar = tqdm(
        total=total,
        initial=len(losses) * steps_per_epoch,
        desc="distill: training",
        unit="step",
        disable=not progress,
        dynamic_ncols=True,
    )
    for epoch in range(len(losses), config.epochs):
        order = np.random.default_rng([config.seed, epoch]).permutation(len(examples))
        epoch_loss = 0.0
        for start in range(0, len(order), config.batch_size):
            batch = [examples[i] for i in order[start : start + config.batch_size]]
            loss = kl_loss(student, batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            scheduler.step()
            epoch_loss += loss.item() * len(batch)
            bar.update(1)
            bar.set_postfix(epoch=epoch + 1, kl=f"{loss.item():.3f}")
        losses.append(epoch_loss / max(1, len(examples)))
        _save(
            state_path,
            {
                "tensors": student.state(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "losses": losses,
            },
        )
    bar.close()
    return losses


def _save(path: Path, state: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
