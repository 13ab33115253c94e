"""The int8 export of a Laya checkpoint: int8 weights for the GEMMs that span every token.

The recipe (``RECIPE``) is onnxruntime's dynamic quantization: the weights of the four GEMMs of
every encoder layer (``Wqkv``, ``Wo``, ``Wi``, ``mlp.Wo``) and of the decision head's GEMMs that
run over the whole row (all four of each head layer before the last, the last one's key/value
projection) become symmetric int8 with one scale per output channel; their inputs are quantized
to uint8 per tensor at run time, so those products run as int8 dot products (VNNI on x86). The
head's GEMMs at the read positions (the last head layer's queries, output projection and FFN,
the scorer, the act head: a few rows per question) stay fp32: they cost little and sit next to
the answer. Before quantizing, the input of the GEMM kinds in ``RECIPE["row_scaled"]``
(``mlp.Wo``, the head FFN's ``linear2``) is scaled to a max |value| of 1 per token row and the
product scaled back (``cascade.laya.row_scale``, exact in fp32), so its per-tensor scale is not
set by the batch's most extreme token: on ``mlp.Wo``'s heavy-tailed input (GELU x gate) that
scale was the largest source of int8 error measured; scaling the other kinds' inputs too
flipped a little less but cost about a tenth of the speed-up (docs/benchmarks.md, "Laya int8
recipes").
Everything else stays fp32: the embeddings, every LayerNormalization, the rotary tables, the
attention scores, softmax and the attention-weighted values (activation x activation products).
The GEMMs are found by graph knowledge (``gemm_kinds``: the order ``cascade.laya.graph`` builds
every weight GEMM in, the count checked against the graph), not by names.

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
from cascade.laya.export import META_FILE, MODEL_FILE, cache_root, export, model_name_of

# The weight GEMMs of one encoder layer, of each head layer before the last, and of the last
# head layer (whose queries and FFN run at the read positions only), then the scorer's and the
# act head's: the order cascade.laya.graph builds them in.
GEMM_KINDS = ("Wqkv", "Wo", "Wi", "mlp.Wo")
HEAD_KINDS = ("head.in_proj", "head.out_proj", "head.linear1", "head.linear2")
LAST_HEAD_KINDS = (
    "head.last.q",
    "head.last.kv",
    "head.last.out_proj",
    "head.last.linear1",
    "head.last.linear2",
)
OUTPUT_KINDS = ("scorer.1", "scorer.3", "act_head.0", "act_head.2")
# Bump "version" when the recipe's meaning changes without its fields changing (another
# onnxruntime quantizer behaviour, another node selection): the cache key follows both.
RECIPE: dict[str, Any] = {
    "version": 3,
    "method": "dynamic",
    "weights": "QInt8",
    "per_channel": True,
    "reduce_range": False,
    "gemms": [*GEMM_KINDS, *HEAD_KINDS, "head.last.kv"],
    "row_scaled": ["mlp.Wo", "head.linear2"],
    "quantized": "the GEMMs over every token: the encoder's (Wqkv, Wo, Wi, mlp.Wo) and the "
    "head's (each layer's before the last, the last one's key/value projection); "
    "mlp.Wo's and the head FFN's linear2 input scaled to max |x| 1 per token row "
    "(the product scaled back) before its per-tensor uint8 quantization",
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


def gemm_kinds(model: Any, layers: int, head_layers: int) -> list[tuple[Any, str]]:
    """Every weight GEMM of ``model`` (a ``MatMul`` with an initializer as its weight, in graph
    order) with its kind, for a checkpoint of ``layers`` encoder and ``head_layers`` head
    layers; a graph with another count of them is refused."""
    weights = {init.name for init in model.graph.initializer}
    found = [n for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in weights]
    head = [*HEAD_KINDS * (head_layers - 1), *LAST_HEAD_KINDS] if head_layers else []
    kinds = [*GEMM_KINDS * layers, *head, *OUTPUT_KINDS]
    if len(found) != len(kinds):
        raise RuntimeError(
            f"found {len(found)} weight GEMMs, expected {len(kinds)} for "
            f"{layers} encoder and {head_layers} head layers"
        )
    return list(zip(found, kinds, strict=True))


def int8_gemms(model: Any, layers: int, head_layers: int) -> list[tuple[Any, str]]:
    """The weight GEMMs the recipe quantizes, with their kinds (``gemm_kinds``)."""
    return [
        (n, kind) for n, kind in gemm_kinds(model, layers, head_layers) if kind in RECIPE["gemms"]
    ]


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
    from cascade.laya.row_scale import row_scale

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
    cfg = load_config(ckpt)
    try:
        chosen = int8_gemms(model, cfg.encoder.layers, cfg.head_layers)
    except RuntimeError as exc:
        raise RuntimeError(f"{fp32}: {exc}") from exc
    gemms = [node.name for node, _ in chosen]
    scaled = {node.name for node, kind in chosen if kind in RECIPE["row_scaled"]}
    row_scale(model, scaled)
    progress(
        f"laya int8: quantizing {len(gemms)} GEMMs (per-channel int8 weights; "
        f"{len(scaled)} inputs row-scaled)"
    )
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
            **model_name_of(ckpt),
        }
        (work / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        if target.exists():
            shutil.rmtree(target)
        work.rename(target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    progress(f"laya int8: wrote {target}")
    return target
