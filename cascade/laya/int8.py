"""The int8 export of a Laya checkpoint: int8 weights for the encoder's GEMMs, the rest fp32.

The recipe (``RECIPE``) is onnxruntime's dynamic quantization: the weights of the four GEMMs of
every encoder layer (``Wqkv``, ``Wo``, ``Wi``, ``mlp.Wo``) become symmetric int8 with one scale
per output channel; their inputs are quantized to uint8 per tensor at run time, so those
products run as int8 dot products (VNNI on x86). Before quantizing, the input of the GEMM
kinds in ``RECIPE["row_scaled"]`` (``mlp.Wo``) is scaled to a max |value| of 1 per token row and
the product scaled back (``cascade.laya.row_scale``, exact in fp32), so its per-tensor scale is
not set by the batch's most extreme token: on ``mlp.Wo``'s heavy-tailed input (GELU x gate)
that scale was the largest source of int8 error measured; scaling the other three kinds' inputs
too flipped a little less but cost about a tenth of the speed-up (README, "Laya in int8").
Everything else stays fp32: the embeddings, every LayerNormalization, the rotary tables, the
attention scores, softmax and the attention-weighted values (activation x activation products),
the decision head, the scorer and the act head. The encoder's GEMMs are found by graph knowledge
(``cascade.laya.graph`` builds the encoder before anything reads ``qtype``, four GEMMs per layer
in the order of ``GEMM_KINDS``; the count is checked), not by names.

An int8 export lives beside the fp32 one in the cache, under a key of the checkpoint's content
hash, the precision and the recipe (``int8_key``): ``<cache>/<hash[:16]>-int8-<recipe id>/``
holds ``model.onnx`` (one file) and ``export.json`` (the checkpoint's hash, the recipe and the
model's own sha256). It is made from the fp32 export (made first when missing). Whether it may
serve is decided by a flip report (``cascade.laya.flip_report``) on the user's own requests.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cascade.laya.checkpoint import content_hash
from cascade.laya.export import META_FILE, MODEL_FILE, cache_root, export
from cascade.laya.row_scale import row_scale

# The encoder's weight GEMMs of one layer, in the order cascade.laya.graph builds them.
GEMM_KINDS = ("Wqkv", "Wo", "Wi", "mlp.Wo")
# Bump "version" when the recipe's meaning changes without its fields changing (another
# onnxruntime quantizer behaviour, another node selection): the cache key follows both.
RECIPE: dict[str, Any] = {
    "version": 2,
    "method": "dynamic",
    "weights": "QInt8",
    "per_channel": True,
    "reduce_range": False,
    "row_scaled": ["mlp.Wo"],
    "quantized": "encoder GEMMs (Wqkv, Wo, Wi, mlp.Wo); mlp.Wo's input scaled to max |x| 1 per "
                 "token row (the product scaled back) before its per-tensor uint8 quantization",
}
REPORT_FILE = "flip-report.json"


def recipe_id() -> str:
    """Short sha256 of the recipe (its version included)."""
    return hashlib.sha256(json.dumps(RECIPE, sort_keys=True).encode()).hexdigest()[:8]


def int8_key(digest: str) -> str:
    """Cache directory name of the int8 export of the checkpoint with content hash ``digest``."""
    return f"{digest[:16]}-int8-{recipe_id()}"


def model_hash(path: Path) -> str:
    """sha256 hex of a model file (what a flip report is stamped with)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def cached_int8(ckpt: Path, cache: Path | None = None, digest: str | None = None) -> Path | None:
    """The directory of a finished int8 export of ``ckpt`` (this recipe), if there is one."""
    target = (cache or cache_root()) / int8_key(digest or content_hash(ckpt))
    return target if (target / META_FILE).exists() else None


def encoder_gemms(model: Any) -> list[Any]:
    """The encoder's weight GEMMs: ``MatMul`` nodes with an initializer as their weight,
    before the first node that reads ``qtype`` (where the decision head starts); layer by
    layer, each layer's in the order of ``GEMM_KINDS``."""
    weights = {init.name for init in model.graph.initializer}
    found = []
    for node in model.graph.node:
        if "qtype" in node.input:
            break
        if node.op_type == "MatMul" and node.input[1] in weights:
            found.append(node)
    return found


def export_int8(
    ckpt: Path,
    out: Path | None = None,
    *,
    cache: Path | None = None,
    progress: Callable[[str], None] = print,
) -> Path:
    """Quantize ``ckpt``'s fp32 export by ``RECIPE``; return the int8 export's directory
    (a cached one when it exists). ``out`` overrides the cache location."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from cascade.laya.config import load_config

    digest = content_hash(ckpt)
    target = out or (cache or cache_root()) / int8_key(digest)
    meta_path = target / META_FILE
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        if meta.get("content_hash") == digest and meta.get("recipe") == RECIPE:
            progress(f"laya int8: cached at {target}")
            return target
    if target.exists() and not meta_path.exists() and any(target.iterdir()):
        raise FileExistsError(f"{target} exists and is not a cascade export; not overwriting it")
    fp32 = export(ckpt, cache=cache, progress=progress)
    model = onnx.load(str(fp32 / MODEL_FILE))
    for i, node in enumerate(model.graph.node):  # the quantizer selects nodes by name
        node.name = node.name or f"{node.op_type}_{i}"
    gemms = [node.name for node in encoder_gemms(model)]
    layers = load_config(ckpt).encoder.layers
    if len(gemms) != len(GEMM_KINDS) * layers:
        raise RuntimeError(f"{fp32}: found {len(gemms)} encoder GEMMs, expected "
                           f"{len(GEMM_KINDS) * layers}")
    scaled = {name for i, name in enumerate(gemms)
              if GEMM_KINDS[i % len(GEMM_KINDS)] in RECIPE["row_scaled"]}
    row_scale(model, scaled)
    progress(f"laya int8: quantizing {len(gemms)} encoder GEMMs (per-channel int8 weights; "
             f"{len(scaled)} mlp.Wo inputs row-scaled)")
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".int8-", dir=target.parent))
    work.chmod(0o755)
    try:
        quantize_dynamic(
            model,
            work / MODEL_FILE,
            weight_type=QuantType.QInt8,
            per_channel=RECIPE["per_channel"],
            reduce_range=RECIPE["reduce_range"],
            nodes_to_quantize=gemms,
            op_types_to_quantize=["MatMul"],
        )
        meta = {
            "content_hash": digest,
            "checkpoint": str(ckpt),
            "precision": "int8",
            "recipe": RECIPE,
            "model_hash": model_hash(work / MODEL_FILE),
        }
        (work / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        if target.exists():
            shutil.rmtree(target)
        work.rename(target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    progress(f"laya int8: wrote {target}")
    return target
