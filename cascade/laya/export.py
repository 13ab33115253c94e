"""Export a Laya checkpoint to fp32 ONNX, cached by content hash, checked against torch.

``export(ckpt)`` writes ``model.onnx`` + ``model.onnx.data`` (weights as external data) and
``export.json`` into ``<cache>/<hash[:16]>/`` (or ``out``). Before the directory is published
(an atomic rename), the ONNX session is compared with the torch reference over a sweep of
shapes: ``|Δlogits| <= 1e-3`` and ``|Δact_logits| <= 1e-2`` (act logits run to ~1e3), as
upstream's exporter gates, and ``|Δpooled| <= 1e-3`` (cascade's extra output, the novelty
gate's vectors). An export made before ``pooled`` existed (``export.json`` without it in
``outputs``) is made again. Needs the ``export`` extra (onnx; torch + transformers for the
check).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from cascade.laya.checkpoint import content_hash, load_weights
from cascade.laya.config import LayaConfig, load_config
from cascade.settings import cache_dir

LOGITS_TOL = 1e-3
ACT_TOL = 1e-2
MODEL_FILE = "model.onnx"
META_FILE = "export.json"
OUTPUTS = ["logits", "act_logits", "pooled"]


class ExportCheckFailed(RuntimeError):
    """The exported graph disagrees with the torch reference."""


def cache_root() -> Path:
    """``$CASCADE_CACHE/laya-onnx``, else ``~/.cache/cascade/laya-onnx``."""
    return cache_dir() / "laya-onnx"


def cached_export(ckpt: Path, cache: Path | None = None) -> Path | None:
    """The directory of a finished export of ``ckpt`` in ``cache``, if there is one."""
    target = (cache or cache_root()) / content_hash(ckpt)[:16]
    return target if _current(target) else None


def _current(target: Path) -> bool:
    """Whether ``target`` holds a finished export with every output of this version."""
    meta = target / META_FILE
    return meta.exists() and json.loads(meta.read_text()).get("outputs") == OUTPUTS


def model_name_of(ckpt: Path) -> dict[str, Any]:
    """The checkpoint's ``model_name``, for its export's ``export.json``: an export of random
    weights carries their marker (``cascade.build.random_weights``) as its checkpoint does."""
    agent = json.loads((ckpt / "rl_agent_config.json").read_text(encoding="utf-8"))
    return {"model_name": agent["model_name"]} if "model_name" in agent else {}


def sample_feeds(cfg: LayaConfig, batch: int, seq: int, markers: int, seed: int) -> dict:
    """Random but well-formed model inputs: padded rows, markers inside each row."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(max(markers + 1, seq // 2), seq + 1, batch)
    lengths[0] = seq
    ids = rng.integers(0, cfg.encoder.vocab, (batch, seq))
    mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int64)
    counts = rng.integers(1, markers + 1, batch)
    counts[0] = markers
    pos = np.zeros((batch, max(2, markers)), np.int64)
    mmask = np.zeros_like(pos, dtype=bool)
    for i, (n, length) in enumerate(zip(counts, lengths, strict=True)):
        pos[i, :n] = np.sort(rng.choice(np.arange(1, length), n, replace=False))
        mmask[i, :n] = True
    qtype = rng.integers(0, 3, batch)
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "marker_pos": pos,
        "marker_mask": mmask,
        "qtype": qtype,
    }


def self_check(cfg: LayaConfig, weights: dict, model_path: Path) -> dict[str, float]:
    """Max |Δ| between ONNX Runtime and the torch reference; raises ``ExportCheckFailed``."""
    import onnxruntime as ort

    from cascade.laya.torch_ref import TorchLaya

    reference = TorchLaya(cfg, weights)
    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    worst = {"logits": 0.0, "act_logits": 0.0, "pooled": 0.0}
    seqs = sorted({16, 64, min(cfg.max_len, 256)})
    for n, (seq, batch, markers) in enumerate(
        [(s, b, k) for s in seqs for b in (1, 3) for k in (2, 5)]
    ):
        feeds = sample_feeds(cfg, batch, seq, min(markers, seq - 1), seed=n)
        ours = session.run(OUTPUTS, feeds)
        ref = [*reference.forward(feeds), reference.pooled(feeds)]
        for name, a, b in zip(worst, ours, ref, strict=True):
            worst[name] = max(worst[name], float(np.abs(a - b).max()))
    if max(worst["logits"], worst["pooled"]) > LOGITS_TOL or worst["act_logits"] > ACT_TOL:
        raise ExportCheckFailed(f"ONNX disagrees with torch: {worst}")
    return worst


def export(
    ckpt: Path,
    out: Path | None = None,
    *,
    cache: Path | None = None,
    progress: Callable[[str], None] = print,
) -> Path:
    """Export ``ckpt`` (self-checked) and return the export directory; reuses a cached one."""
    import onnx

    from cascade.laya.graph import build_graph

    digest = content_hash(ckpt)
    target = out or (cache or cache_root()) / digest[:16]
    if _current(target) and json.loads((target / META_FILE).read_text())["content_hash"] == digest:
        progress(f"laya export: cached at {target}")
        return target
    if target.exists() and not (target / META_FILE).exists() and any(target.iterdir()):
        raise FileExistsError(f"{target} exists and is not a cascade export; not overwriting it")
    cfg = load_config(ckpt)
    progress(f"laya export: loading weights of {ckpt}")
    weights = load_weights(ckpt, cfg)
    progress(f"laya export: building the graph ({cfg.encoder.layers} encoder layers)")
    model = build_graph(cfg, weights)
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".export-", dir=target.parent))
    work.chmod(0o755)
    try:
        onnx.save_model(
            model,
            str(work / MODEL_FILE),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=MODEL_FILE + ".data",
            size_threshold=1024,
        )
        del model
        progress("laya export: checking ONNX Runtime against the torch reference")
        diffs = self_check(cfg, weights, work / MODEL_FILE)
        progress(
            f"laya export: max |Δlogits| {diffs['logits']:.2e}, "
            f"|Δact_logits| {diffs['act_logits']:.2e}"
        )
        meta = {
            "content_hash": digest,
            "checkpoint": str(ckpt),
            "self_check": diffs,
            "outputs": OUTPUTS,
            **model_name_of(ckpt),
        }
        (work / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        if target.exists():
            shutil.rmtree(target)
        work.rename(target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    progress(f"laya export: wrote {target}")
    return target
