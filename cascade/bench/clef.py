"""``cascade bench clef``: our engine path against the reference ``systemone`` loop, same weights.

``--shape 9b`` builds Qwen3.5-9B-shaped random bf16 weights on CUDA (spec §5.2) with the
Clef-flash head config; ``--shape tiny`` uses a tiny release (``--release`` or a fresh
``make_tiny``) and runs anywhere. For each target state length it times one request at a
time (median/p95, tokenization included) for ours and for the reference, then throughput
with ``--concurrency`` clients through the real ``MicroBatcher`` against the reference's
sequential loop, and peak device memory. Prints a table, then one JSON line.
"""

from __future__ import annotations

import asyncio
import functools
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

FLASH_TEXT = {
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 32,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "rms_norm_eps": 1e-6,
    "vocab_size": 248320,
    "tie_word_embeddings": False,
    "max_position_embeddings": 262144,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 1e7,
        "partial_rotary_factor": 0.25,
        "mrope_interleaved": True,
        "mrope_section": [11, 11, 10],
    },
}
FLASH_VISION = {
    "depth": 27,
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_heads": 16,
    "patch_size": 16,
    "temporal_patch_size": 2,
    "spatial_merge_size": 2,
    "out_hidden_size": 4096,
    "num_position_embeddings": 2304,
    "hidden_act": "gelu_pytorch_tanh",
}
FLASH_HEAD = {
    "hidden_size": 4096,
    "width": 1024,
    "routing_layers": 2,
    "layers": 4,
    "heads": 16,
    "feedforward": 4096,
}
# Random-weight shapes: (text config, vision config, head config).
SHAPES = {"9b": (FLASH_TEXT, FLASH_VISION, FLASH_HEAD)}
QUESTIONS = {
    "team": {
        "type": "choice",
        "instructions": "Which team should handle this?",
        "criteria": {
            "billing": "Payments and refunds",
            "technical": "Bugs and outages",
            "account": "Logins and profiles",
            "sales": None,
        },
    },
    "urgent": {"type": "noul", "instructions": "Does this need a reply within the hour?"},
    "anger": {
        "type": "score",
        "instructions": "How angry is the customer?",
        "criteria": ["calm", "annoyed", "upset", "angry", "furious"],
    },
}
SENTENCE = " the customer says the invoice is wrong and asks for a refund."


def build(shape: str, release: Path | None, device: str, workdir: Path) -> tuple[Any, Any]:
    """``(our Release, the reference ClefModel)`` sharing one backbone."""
    import torch

    from cascade.clef import release as rel
    from cascade.clef.tiny import make_tiny

    if shape == "tiny":
        ours = rel.load(rel.resolve_release(release or make_tiny(workdir / "tiny")), device)
    else:
        ours = _random_bf16(workdir, rel.pick_device(device), *SHAPES[shape])
    jsm = _reference_module()
    head = jsm.JointSchemaHead(**rel.head_config(ours.path))
    head.load_state_dict(ours.head.state_dict(), strict=True)
    head = head.to(ours.device, ours.dtype)  # as load_release_model does
    with torch.no_grad():
        model = jsm.ClefModel(ours.backbone, head).eval()
    return ours, model


def _random_bf16(
    workdir: Path,
    device: Any,
    text: dict[str, Any],
    vision: dict[str, Any],
    head_config: dict[str, int],
) -> Any:
    """A Release with random bf16 backbone weights built on ``device`` (no files but configs)."""
    import torch
    from transformers import AutoTokenizer, Qwen3_5Config, Qwen3_5ForConditionalGeneration

    from cascade.clef.head import JointSchemaHead
    from cascade.clef.release import Release
    from cascade.clef.tiny import write_tokenizer

    ids = write_tokenizer(workdir)
    (workdir / "joint_head_config.json").write_text(json.dumps(head_config))
    config = Qwen3_5Config(
        text_config={
            **text,
            "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"],
        },
        vision_config=vision,
        tie_word_embeddings=False,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    with torch.device(device):
        backbone = Qwen3_5ForConditionalGeneration._from_config(config, dtype=torch.bfloat16)
        head = JointSchemaHead(**head_config)
    with torch.no_grad():  # trained-like scales, so the logits are not degenerate
        head.prior_logit_scale.fill_(2.3)
        head.joint_logit_scale.fill_(2.3)
        head.residual_gate.fill_(-2.0)
    backbone.eval().config.use_cache = False
    return Release(
        path=workdir,
        backbone=backbone,
        head=head.eval(),
        tokenizer=AutoTokenizer.from_pretrained(workdir),
        device=device,
        dtype=torch.bfloat16,
    )


def _reference_module() -> Any:
    from clef_finetune._vendor import joint_schema_model

    return joint_schema_model


def request(tokenizer: Any, tokens: int, variant: int = 0) -> dict[str, Any]:
    """A body whose state has about ``tokens`` tokens."""
    per = len(tokenizer(SENTENCE, add_special_tokens=False).input_ids)
    state = f"Ticket {variant}:" + SENTENCE * max(1, tokens // per)
    return {"model": "clef-flash", "state": state, "questions": QUESTIONS}


def timed(fn: Callable[[], Any], repeats: int) -> list[float]:
    fn()  # warm-up
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append((time.perf_counter() - start) * 1000)
    return out


def summary(ms: list[float]) -> dict[str, float]:
    ordered = sorted(ms)
    return {
        "p50_ms": round(statistics.median(ordered), 2),
        "p95_ms": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 2),
    }


class _TextProcessor:
    """What the reference ``systemone`` needs of a processor for text-only bodies."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer


def run(
    shape: str = "tiny",
    *,
    release: Path | None = None,
    device: str = "auto",
    tokens: tuple[int, ...] = (1024, 4096, 16384),
    repeats: int = 20,
    concurrency: int = 8,
    requests: int = 64,
) -> dict[str, Any]:
    """Run the whole benchmark and return its results (what the CLI prints as JSON)."""
    import msgspec
    import torch

    from cascade.clef.prompt import PromptEncoder, locked_tokenize
    from cascade.clef.runner import ClefRunner, Job
    from cascade.schema import Question

    with tempfile.TemporaryDirectory() as tmp:
        ours, model = build(shape, release, device, Path(tmp))
    tok, dev = ours.tokenizer, ours.device
    weights_gib = _peak_gib(dev)  # nothing has run yet: the build peak, about the weights
    limit = max(tokens) + 4096
    encoder = PromptEncoder(locked_tokenize(tok), max_length=limit)
    runner = ClefRunner(ours, max_batch_tokens=concurrency * limit)
    questions = msgspec.convert(QUESTIONS, dict[str, Question])
    processor = _TextProcessor(tok)
    jsm = _reference_module()

    def prepare(body: dict[str, Any]) -> Job:
        return Job(encoder.encode(body["state"], questions))

    def ours_once(body: dict[str, Any]) -> Any:
        (out,) = runner.run_batch([prepare(body)])
        if isinstance(out, Exception):
            raise out
        return out

    def reference_once(body: dict[str, Any]) -> Any:
        return jsm.systemone(model, processor, body, max_length=limit)

    rows = []
    for target in tokens:
        body = request(tok, target)
        row: dict[str, Any] = {
            "target_tokens": target,
            "input_tokens": len(prepare(body).encoded.input_ids),
        }
        for name, fn in (("ours", ours_once), ("reference", reference_once)):
            _reset_peak(dev)
            row[name] = summary(timed(functools.partial(fn, body), repeats))
            row[name]["peak_gib"] = _peak_gib(dev)
        rows.append(row)
    bodies = [request(tok, tokens[0], i) for i in range(requests)]
    _reset_peak(dev)
    ours_rps = asyncio.run(_serve(runner, prepare, bodies, concurrency))
    batched_peak = _peak_gib(dev)
    start = time.perf_counter()
    for body in bodies:
        reference_once(body)
    reference_rps = len(bodies) / (time.perf_counter() - start)
    return {
        "shape": shape,
        "device": str(dev),
        "dtype": str(ours.dtype).removeprefix("torch."),
        "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
        "weights_gib": weights_gib,
        "latency": rows,
        "throughput": {
            "concurrency": concurrency,
            "requests": requests,
            "target_tokens": tokens[0],
            "ours_rps": round(ours_rps, 2),
            "reference_rps": round(reference_rps, 2),
            "ratio": round(ours_rps / reference_rps, 2),
            "peak_gib": batched_peak,
        },
    }


async def _serve(
    runner: Any, prepare: Callable[[Any], Any], bodies: list[Any], concurrency: int
) -> float:
    """Requests per second with ``concurrency`` clients through the engine's batcher."""
    from cascade.engines.batcher import MicroBatcher

    batcher = MicroBatcher(
        runner.run_batch,
        name="bench",
        max_batch_items=concurrency,
        max_batch_cost=runner.max_batch_tokens,
        cost=lambda job: job.length,
        max_wait_s=0.005,
        max_queue=len(bodies),
        sort_key=lambda job: job.length,
    )
    pending = list(bodies[:concurrency])

    async def client() -> None:
        while pending:
            job = await asyncio.to_thread(prepare, pending.pop())
            (out,) = await batcher.submit([job])
            if isinstance(out, Exception):
                raise out

    await asyncio.gather(*(client() for _ in range(concurrency)))  # warm-up round
    pending[:] = bodies
    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    elapsed = time.perf_counter() - start
    await batcher.aclose()
    return len(bodies) / elapsed


def _reset_peak(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def _peak_gib(device: Any) -> float | None:
    import torch

    if device.type != "cuda":
        return None
    return round(torch.cuda.max_memory_allocated(device) / 2**30, 2)


def table(result: dict[str, Any]) -> str:
    """The human-readable report (the JSON carries the same numbers)."""
    lines = [
        f"Clef bench: shape={result['shape']} device={result['device']} "
        f"({result['gpu'] or 'cpu'}) dtype={result['dtype']}, random weights "
        f"({result['weights_gib']} GiB after load)",
        f"{'state':>7} {'input':>7} {'ours p50':>9} {'ours p95':>9} {'ref p50':>9} "
        f"{'ref p95':>9} {'speedup':>8} {'peak GiB':>9}",
    ]
    for row in result["latency"]:
        ours, ref = row["ours"], row["reference"]
        lines.append(
            f"{row['target_tokens']:>7} {row['input_tokens']:>7} {ours['p50_ms']:>9} "
            f"{ours['p95_ms']:>9} {ref['p50_ms']:>9} {ref['p95_ms']:>9} "
            f"{ref['p50_ms'] / ours['p50_ms']:>7.2f}x {str(ours['peak_gib']):>9}"
        )
    tp = result["throughput"]
    lines.append(
        f"throughput, {tp['concurrency']} concurrent at ~{tp['target_tokens']} tokens: "
        f"ours {tp['ours_rps']} req/s, reference {tp['reference_rps']} req/s, "
        f"{tp['ratio']}x (peak {tp['peak_gib']} GiB)"
    )
    first = result["latency"][0]
    p50 = first["ours"]["p50_ms"]
    lines.append(
        f"goals: p50 at ~{first['target_tokens']} state tokens <= 39 ms: "
        f"{'met' if p50 <= 39 else 'NOT met'} ({p50} ms); throughput >= 3x reference: "
        f"{'met' if tp['ratio'] >= 3 else 'NOT met'} ({tp['ratio']}x)"
    )
    return "\n".join(lines)
