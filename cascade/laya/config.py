"""Read and check a Laya checkpoint's two config files (spec §1.2, §1.3, §7.1).

``load_config(dir)`` returns a frozen ``LayaConfig``; anything cascade cannot run exactly as Laya
does raises ``CheckpointError`` naming the file and the problem. Temperatures are clamped the way
Laya clamps them (``clamp_temperature``); each replaced entry is logged.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import msgspec

from cascade.questions import option_band

log = logging.getLogger(__name__)

TEMP_MIN = 0.5
TEMP_MAX = 5.0
QTYPES = {"choice": 0, "score": 1, "noul": 2}


class CheckpointError(ValueError):
    """A checkpoint cascade cannot serve (missing file or tensor, unsupported architecture)."""


class EncoderConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The ModernBERT encoder shape, normalised from either config format."""

    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab: int
    window: int  # ``local_attention``: a local layer sees |i - j| <= window // 2
    global_theta: float
    local_theta: float
    global_layers: tuple[bool, ...]  # per layer: full attention (True) or sliding (False)
    norm_eps: float = 1e-5
    max_positions: int = 8192

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


class LayaConfig(msgspec.Struct, frozen=True, kw_only=True):
    """What inference reads from ``rl_agent_config.json`` plus the encoder shape."""

    encoder_id: str
    head_layers: int
    n_act: int
    max_len: int
    head_max_len: int
    temperature: tuple[float, float, float]  # clamped, per qtype [choice, score, noul]
    temperature_by_options: dict[str, float]  # clamped, keys like "choice:3-5"
    encoder: EncoderConfig

    def temperature_for(self, qtype: int, k: int) -> float:
        """Laya's precedence: the option-count bucket first, then the per-type value."""
        return self.temperature_by_options.get(temp_bucket(qtype, k), self.temperature[qtype])


def temp_bucket(qtype: int, k: int) -> str:
    return f"{list(QTYPES)[qtype]}:{option_band(k)}"


def clamp_temperature(value: Any) -> float:
    """Laya's rule: non-numbers (bools, NaN, inf included) become 1.0, others go to [0.5, 5]."""
    if isinstance(value, bool):
        return 1.0
    try:
        t = float(value)
    except (TypeError, ValueError):
        return 1.0
    if not math.isfinite(t):
        return 1.0
    return min(TEMP_MAX, max(TEMP_MIN, t))


def _clamped(name: str, raw: Any) -> float:
    applied = clamp_temperature(raw)
    if isinstance(raw, bool) or not isinstance(raw, int | float) or float(raw) != applied:
        log.warning("temperature %s=%r replaced by %s", name, raw, applied)
    return applied


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise CheckpointError(f"{path}: missing") from exc
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: unreadable JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return data


def _rope_thetas(raw: dict[str, Any], where: Path) -> tuple[float, float]:
    rope = raw.get("rope_parameters")
    if isinstance(rope, dict):  # transformers 5 form, preferred when present
        thetas = []
        for kind, default in (("full_attention", 160000.0), ("sliding_attention", 10000.0)):
            params = rope.get(kind, rope)
            if params.get("rope_type", "default") != "default":
                raise CheckpointError(f"{where}: unsupported rope_type {params['rope_type']!r}")
            thetas.append(float(params.get("rope_theta", default)))
        return thetas[0], thetas[1]
    if raw.get("rope_scaling"):
        raise CheckpointError(f"{where}: rope_scaling is not supported")
    return float(raw.get("global_rope_theta", 160000.0)), float(
        raw.get("local_rope_theta", 10000.0)
    )


def parse_encoder_config(raw: dict[str, Any], where: Path) -> EncoderConfig:
    """Both ``rope_parameters``/``layer_types`` (v5) and ``*_rope_theta`` (v4) forms."""
    if raw.get("model_type", "modernbert") != "modernbert":
        raise CheckpointError(f"{where}: model_type {raw['model_type']!r} is not modernbert")
    for flag in ("attention_bias", "mlp_bias", "norm_bias"):
        if raw.get(flag):
            raise CheckpointError(f"{where}: {flag}=true is not supported (Laya has no biases)")
    if raw.get("hidden_activation", "gelu") != "gelu":
        raise CheckpointError(f"{where}: hidden_activation {raw['hidden_activation']!r} != gelu")
    try:
        layers = int(raw["num_hidden_layers"])
        hidden, heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
        intermediate, vocab = int(raw["intermediate_size"]), int(raw["vocab_size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{where}: missing or bad encoder size field ({exc})") from exc
    if hidden % heads:
        raise CheckpointError(f"{where}: hidden_size {hidden} not divisible by {heads} heads")
    kinds = raw.get("layer_types")
    if kinds is not None:
        if len(kinds) != layers or not set(kinds) <= {"full_attention", "sliding_attention"}:
            raise CheckpointError(f"{where}: bad layer_types {kinds!r}")
        global_layers = tuple(k == "full_attention" for k in kinds)
    else:
        every = int(raw.get("global_attn_every_n_layers", 3))
        global_layers = tuple(i % every == 0 for i in range(layers))
    global_theta, local_theta = _rope_thetas(raw, where)
    return EncoderConfig(
        hidden=hidden,
        layers=layers,
        heads=heads,
        intermediate=intermediate,
        vocab=vocab,
        window=int(raw.get("local_attention", 128)),
        global_theta=global_theta,
        local_theta=local_theta,
        global_layers=global_layers,
        norm_eps=float(raw.get("norm_eps", 1e-5)),
        max_positions=int(raw.get("max_position_embeddings", 8192)),
    )


def load_config(ckpt: Path) -> LayaConfig:
    """Read ``rl_agent_config.json`` and ``encoder/config.json`` of checkpoint ``ckpt``."""
    where = ckpt / "rl_agent_config.json"
    raw = _read_json(where)
    missing = [k for k in ("encoder", "head_layers") if k not in raw]
    if missing:
        raise CheckpointError(f"{where}: missing required keys {missing}")
    if raw.get("option_layout", "sequential") != "sequential":
        raise CheckpointError(f"{where}: option_layout {raw['option_layout']!r} is not supported")
    temps = raw.get("temperature", [1.0, 1.0, 1.0])
    if not isinstance(temps, list) or len(temps) != 3:
        raise CheckpointError(f"{where}: temperature must be a list of 3 numbers, got {temps!r}")
    by_options = raw.get("temperature_by_options") or {}
    if not isinstance(by_options, dict):
        raise CheckpointError(f"{where}: temperature_by_options must be an object")
    choice, score, noul = (_clamped(name, t) for name, t in zip(QTYPES, temps, strict=True))
    return LayaConfig(
        encoder_id=str(raw["encoder"]),
        head_layers=int(raw["head_layers"]),
        n_act=len(raw.get("act_costs") or {}) + 1,
        max_len=int(raw.get("max_len", 512)),
        head_max_len=int(raw.get("head_max_len", 192)),
        temperature=(choice, score, noul),
        temperature_by_options={k: _clamped(k, v) for k, v in by_options.items()},
        encoder=parse_encoder_config(
            _read_json(ckpt / "encoder" / "config.json"), ckpt / "encoder" / "config.json"
        ),
    )
