"""Load and verify ``model.safetensors`` of a Laya checkpoint (spec §1.4).

The tensor inventory is checked strictly, as Laya's ``load_state_dict(strict=True)`` does: every
expected tensor with its exact shape, nothing else. F16, BF16 and F32 are accepted and upcast to
fp32 numpy arrays. The safetensors header is parsed here (8-byte length + JSON) so BF16 works
without torch.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import numpy as np

from cascade.laya.config import CheckpointError, LayaConfig

_DTYPES = {"F16": np.float16, "F32": np.float32, "BF16": np.uint16}
ACT_WIDTH = 256  # the act head's hidden width is fixed upstream
HASHED_FILES = ("rl_agent_config.json", "encoder/config.json", "model.safetensors")


def expected_tensors(cfg: LayaConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor name Laya's ``DecisionModel`` state dict holds, with its shape."""
    e = cfg.encoder
    d, f = e.hidden, e.intermediate
    shapes: dict[str, tuple[int, ...]] = {
        "encoder.embeddings.tok_embeddings.weight": (e.vocab, d),
        "encoder.embeddings.norm.weight": (d,),
        "encoder.final_norm.weight": (d,),
        "type_emb.weight": (3, d),
        "scorer.0.weight": (d,),
        "scorer.0.bias": (d,),
        "scorer.1.weight": (d, d),
        "scorer.1.bias": (d,),
        "scorer.3.weight": (1, d),
        "scorer.3.bias": (1,),
        "act_head.0.weight": (ACT_WIDTH, d + 4),
        "act_head.0.bias": (ACT_WIDTH,),
        "act_head.2.weight": (cfg.n_act, ACT_WIDTH),
        "act_head.2.bias": (cfg.n_act,),
        "temperature": (3,),
    }
    for i in range(e.layers):
        p = f"encoder.layers.{i}."
        if i > 0:
            shapes[p + "attn_norm.weight"] = (d,)
        shapes |= {
            p + "attn.Wqkv.weight": (3 * d, d),
            p + "attn.Wo.weight": (d, d),
            p + "mlp_norm.weight": (d,),
            p + "mlp.Wi.weight": (2 * f, d),
            p + "mlp.Wo.weight": (d, f),
        }
    for j in range(cfg.head_layers):
        p = f"head.layers.{j}."
        shapes |= {
            p + "self_attn.in_proj_weight": (3 * d, d),
            p + "self_attn.in_proj_bias": (3 * d,),
            p + "self_attn.out_proj.weight": (d, d),
            p + "self_attn.out_proj.bias": (d,),
            p + "linear1.weight": (4 * d, d),
            p + "linear1.bias": (4 * d,),
            p + "linear2.weight": (d, 4 * d),
            p + "linear2.bias": (d,),
        }
        for norm in ("norm1", "norm2"):
            shapes |= {p + f"{norm}.weight": (d,), p + f"{norm}.bias": (d,)}
    return shapes


def read_header(path: Path) -> tuple[dict[str, dict], int]:
    """The safetensors header (tensor name -> dtype/shape/offsets) and the data start offset."""
    try:
        with path.open("rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(size))
    except FileNotFoundError as exc:
        raise CheckpointError(f"{path}: missing") from exc
    except (OSError, struct.error, ValueError) as exc:
        raise CheckpointError(f"{path}: not a safetensors file ({exc})") from exc
    header.pop("__metadata__", None)
    return header, 8 + size


def verify_inventory(header: dict[str, dict], cfg: LayaConfig, where: Path) -> None:
    """Raise ``CheckpointError`` naming missing, unexpected, misshapen or mistyped tensors."""
    want = expected_tensors(cfg)
    problems = [f"missing tensor {n}" for n in want if n not in header]
    problems += [f"unexpected tensor {n}" for n in header if n not in want]
    for name, shape in want.items():
        info = header.get(name)
        if info is None:
            continue
        if tuple(info["shape"]) != shape:
            problems.append(f"{name}: shape {tuple(info['shape'])}, expected {shape}")
        if info["dtype"] not in _DTYPES:
            problems.append(f"{name}: dtype {info['dtype']} (F16, BF16 or F32 only)")
    if problems:
        more = f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""
        raise CheckpointError(f"{where}: " + "; ".join(problems[:5]) + more)


def load_weights(ckpt: Path, cfg: LayaConfig) -> dict[str, np.ndarray]:
    """Every tensor of ``ckpt/model.safetensors`` as fp32, after the strict inventory check."""
    path = ckpt / "model.safetensors"
    header, start = read_header(path)
    verify_inventory(header, cfg, path)
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    out = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        buf = raw[start + begin : start + end].view(_DTYPES[info["dtype"]])
        if info["dtype"] == "BF16":  # bf16 is the top half of an fp32
            arr = (buf.astype(np.uint32) << 16).view(np.float32)
        else:
            arr = buf.astype(np.float32)
        out[name] = arr.reshape(info["shape"])
    return out


def content_hash(ckpt: Path) -> str:
    """sha256 over the files that define the model's outputs (configs, weights, tokenizer)."""
    digest = hashlib.sha256()
    files = [ckpt / name for name in HASHED_FILES]
    files += sorted((ckpt / "tokenizer").glob("*.json"))
    for path in files:
        digest.update(path.relative_to(ckpt).as_posix().encode() + b"\0")
        with path.open("rb") as fh:
            while chunk := fh.read(1 << 22):
                digest.update(chunk)
    return digest.hexdigest()
