"""A calibration's reference set: per cell (the Laya checkpoint, question type and option band,
``"english/choice:3-5"``) a bounded sample of the cheap tier's pooled vectors, and the distance
above which a row is unlike them.

Compression: each vector is L2-normalised, then randomly projected to ``dims`` dimensions with
one Gaussian matrix (seeded, scaled by ``1/sqrt(dims)``; Johnson-Lindenstrauss keeps distances
within a small factor). A row's novelty is the mean Euclidean distance to its ``k`` nearest
reference vectors (exact, numpy). A cell's threshold is the ``1 - max_flag_rate`` quantile of
its reference vectors' own distances, each left out of its own neighbours: about that share of
rows like the calibration data's is flagged. A cell with fewer than ``min_rows`` vectors gets no
reference (the gate is off there). The file is an ``.npz`` (no pickles) that names the cheap
tier's weights it was made with; its SHA-256 is written into the calibration file.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

VECTOR_DTYPE = "<f2"  # how a tier sends a vector (``QuestionResult.vector``)


class ReferenceError(ValueError):
    """A reference set file that cannot be read, or is not the one a calibration names."""


@dataclass(frozen=True)
class ReferenceSet:
    weights: str  # content hash of the cheap tier's weights the vectors came from
    projection: np.ndarray  # [hidden, dims] float32
    k: int
    max_flag_rate: float
    cells: dict[str, np.ndarray]  # cell -> [n, dims] float32
    thresholds: dict[str, float]  # cell -> novelty above which a row is novel

    @property
    def nbytes(self) -> int:
        """Memory the vectors and the projection hold."""
        return self.projection.nbytes + sum(v.nbytes for v in self.cells.values())

    def novelty(self, cell: str, vector: bytes) -> float | None:
        """The mean distance of ``vector`` to its ``k`` nearest in ``cell`` (None: no
        reference there, or a vector of another width)."""
        reference = self.cells.get(cell)
        raw = decode(vector)
        if reference is None or raw.shape[0] != self.projection.shape[0]:
            return None
        return float(knn(reference, project(self.projection, raw[None, :]), self.k)[0])


def cell_of(checkpoint: str | None, qtype: str, band: str) -> str:
    return f"{checkpoint or '-'}/{qtype}:{band}"


def decode(vector: bytes) -> np.ndarray:
    return np.frombuffer(vector, VECTOR_DTYPE).astype(np.float32)


def project(projection: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """Rows L2-normalised, then projected."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.maximum(norms, 1e-12)) @ projection


def knn(
    reference: np.ndarray, queries: np.ndarray, k: int, *, leave_out_self: bool = False
) -> np.ndarray:
    """Each query's mean distance to its ``k`` nearest reference rows (exact); with
    ``leave_out_self`` the queries are the reference rows and each skips itself."""
    d2 = (
        np.sum(queries**2, 1)[:, None]
        + np.sum(reference**2, 1)[None, :]
        - 2 * queries @ reference.T
    )
    if leave_out_self:
        np.fill_diagonal(d2, np.inf)
    k = min(k, reference.shape[0] - int(leave_out_self))
    nearest = np.partition(d2, k - 1, axis=1)[:, :k]
    return np.sqrt(np.maximum(nearest, 0.0)).mean(axis=1)


def fit(
    vectors: Mapping[str, Iterable[bytes]],
    *,
    weights: str,
    k: int,
    dims: int,
    max_reference: int,
    max_flag_rate: float,
    min_rows: int,
    seed: int = 0,
) -> ReferenceSet:
    """A reference set from each cell's vectors (see the module docstring)."""
    rng = np.random.default_rng(seed)
    decoded = {c: np.stack([decode(v) for v in vs]) for c, vs in vectors.items() if vs}
    decoded = {c: v for c, v in decoded.items() if v.shape[0] >= max(min_rows, k + 1)}
    hidden = next(iter(decoded.values())).shape[1] if decoded else 1
    projection = (
        rng.standard_normal((hidden, min(dims, hidden))) / np.sqrt(min(dims, hidden))
    ).astype(np.float32)
    cells, thresholds = {}, {}
    for cell, rows in sorted(decoded.items()):
        if rows.shape[0] > max_reference:
            rows = rows[rng.choice(rows.shape[0], max_reference, replace=False)]
        sample = project(projection, rows).astype(np.float32)
        own = knn(sample, sample, k, leave_out_self=True)
        cells[cell] = sample
        thresholds[cell] = float(np.quantile(own, 1 - max_flag_rate, method="higher"))
    return ReferenceSet(
        weights=weights,
        projection=projection,
        k=k,
        max_flag_rate=max_flag_rate,
        cells=cells,
        thresholds=thresholds,
    )


def save(path: str | Path, ref: ReferenceSet) -> str:
    """Write ``ref`` as an ``.npz``; its SHA-256 (what the calibration file records)."""
    names = sorted(ref.cells)
    buffer = io.BytesIO()
    arrays: dict[str, Any] = {
        "weights": np.array(ref.weights),
        "projection": ref.projection,
        "k": np.array(ref.k),
        "max_flag_rate": np.array(ref.max_flag_rate),
        "cells": np.array(names, dtype=str),
        "thresholds": np.array([ref.thresholds[c] for c in names], dtype=np.float64),
        **{f"cell_{i}": ref.cells[c] for i, c in enumerate(names)},
    }
    np.savez_compressed(buffer, **arrays)
    data = buffer.getvalue()
    Path(path).write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def load(path: str | Path, sha256: str | None = None) -> ReferenceSet:
    """Read a reference set; raises ``ReferenceError`` when it is unreadable or its SHA-256 is
    not ``sha256``."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ReferenceError(f"{path}: cannot read the novelty reference set ({exc})") from exc
    digest = hashlib.sha256(data).hexdigest()
    if sha256 is not None and digest != sha256:
        raise ReferenceError(
            f"{path}: the calibration names reference set {sha256}, the file is {digest}"
        )
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            names = [str(c) for c in z["cells"]]
            return ReferenceSet(
                weights=str(z["weights"]),
                projection=z["projection"].astype(np.float32),
                k=int(z["k"]),
                max_flag_rate=float(z["max_flag_rate"]),
                cells={c: z[f"cell_{i}"].astype(np.float32) for i, c in enumerate(names)},
                thresholds={c: float(t) for c, t in zip(names, z["thresholds"], strict=True)},
            )
    except (OSError, KeyError, ValueError) as exc:
        raise ReferenceError(f"{path}: not a novelty reference set ({exc})") from exc
