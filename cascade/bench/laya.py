"""``cascade bench laya``: cascade's ONNX engine vs laya's torch ``Agent``, one process.

Both run the same random checkpoint (ModernBERT-base or -large shape, English budgets 512/192)
with the same thread count on the same inputs: a single request at ~128 and ~512 state tokens,
then ``--clients`` concurrent clients over the request mix (laya behind one lock, as
``laya-serve`` runs it). Prints rows/s, p50/p99, the speed-up, and the achieved GFLOP/s (useful
FLOPs of the real tokens) against the fp32 GEMM peak measured in the same run. A benchmark, not
a test: the figures depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import msgspec

from cascade.bench.sample import SAMPLE
from cascade.calls import EngineCall
from cascade.engines.onnx import default_threads
from cascade.laya.config import LayaConfig
from cascade.schema import Question

SHAPES = {
    "tiny": None,
    "base": {
        "hidden_size": 768,
        "intermediate_size": 1152,
        "num_hidden_layers": 22,
        "num_attention_heads": 12,
        "local_attention": 128,
    },
    "large": {
        "hidden_size": 1024,
        "intermediate_size": 2624,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "local_attention": 128,
    },
}
ENGLISH_BUDGETS = {"max_len": 512, "head_max_len": 192}
TRIAGE = {
    "dept": {
        "type": "choice",
        "instructions": "Which department should handle this?",
        "criteria": {"billing": "payments", "tech": "bugs", "account": "login"},
    },
    "urgent": {"type": "noul", "instructions": "Is the customer in a hurry?"},
    "level": {
        "type": "score",
        "instructions": "How frustrated is the customer?",
        "criteria": ["calm", "annoyed", "angry"],
    },
}


def row_flops(cfg: LayaConfig, length: int) -> float:
    """Multiply-adds x2 of one row of ``length`` real tokens (encoder + decision head)."""
    e, n = cfg.encoder, length
    d, f = e.hidden, e.intermediate
    layer = 2 * n * (4 * d * d + 3 * d * f) + 4 * n * n * d
    head = 2 * n * 12 * d * d + 4 * n * n * d
    return e.layers * layer + cfg.head_layers * head


def gemm_peak(threads: int) -> float:
    """Best fp32 GEMM GFLOP/s of 2048x2048 matrices on ``threads`` threads."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    best = float("inf")
    for _ in range(10):
        started = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - started)
    return 2 * 2048**3 / best / 1e9


def state_of(tok: Any, tokens: int) -> str:
    """Text of about ``tokens`` tokens."""
    words = "The customer says the parcel arrived broken and asks for a refund today. " * 200
    text = ""
    for word in words.split():
        if len(tok.encode(text)) >= tokens:
            break
        text += word + " "
    return text.strip()


def summary(latencies: list[float], rows: int, wall: float) -> dict[str, float]:
    ordered = sorted(latencies)
    return {
        "rows_per_s": rows / wall,
        "p50_ms": 1000 * statistics.median(ordered),
        "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
    }


class Runner:
    """Both runtimes on one checkpoint, timing the same requests."""

    def __init__(self, ckpt: Path, cache: Path, threads: int) -> None:
        import torch
        from laya import Agent

        from cascade.engines.laya import LayaEngine
        from cascade.laya.export import export

        torch.set_num_threads(threads)
        export(ckpt, cache=cache)
        copy = shutil.copytree(ckpt, cache / "laya-copy")  # laya rewrites its tokenizer config
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.agent = Agent(str(copy), device="cpu")
        self.lock = threading.Lock()
        self.engine = LayaEngine(
            "laya", {"english": ckpt}, onnx_cache=cache, intra_op_threads=threads, max_wait_s=0.002
        )

    def laya(self, state: Any, questions: dict) -> dict:
        with self.lock:  # laya-serve runs one forward pass at a time
            return self.agent.system_one(state, questions)

    async def ours(self, state: Any, questions: dict) -> Any:
        call = EngineCall(
            state=state, questions=msgspec.convert(questions, dict[str, Question]), model="english"
        )
        return await self.engine.answer(call)


async def _single(r: Runner, state: str, repeat: int) -> dict[str, Any]:
    r.laya(state, TRIAGE)
    await r.ours(state, TRIAGE)
    out: dict[str, Any] = {}
    for name in ("laya", "cascade"):
        times = []
        for _ in range(repeat):
            started = time.perf_counter()
            if name == "laya":
                await asyncio.to_thread(r.laya, state, TRIAGE)
            else:
                await r.ours(state, TRIAGE)
            times.append(time.perf_counter() - started)
        out[name] = summary(times, len(TRIAGE) * repeat, sum(times))
    return out


async def _concurrent(r: Runner, requests: list[dict], clients: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    rows = sum(len(q["questions"]) for q in requests)
    for name in ("laya", "cascade"):
        queue = list(requests)
        latencies: list[float] = []

        async def client(name: str = name, queue: list = queue, latencies: list = latencies):
            while queue:
                req = queue.pop()
                started = time.perf_counter()
                if name == "laya":
                    await asyncio.to_thread(r.laya, req["state"], req["questions"])
                else:
                    await r.ours(req["state"], req["questions"])
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        out[name] = summary(latencies, rows, time.perf_counter() - started)
    return out


async def _bench(args: argparse.Namespace, ckpt: Path, cache: Path) -> dict[str, Any]:
    threads = args.threads or default_threads()
    peak = gemm_peak(threads)  # before any model is loaded
    r = Runner(ckpt, cache, threads)
    await r.engine.start()
    ckpt_info = r.engine.previewer.checkpoints["english"]
    lines = [json.loads(x) for x in (args.sample or SAMPLE).read_text().splitlines() if x]
    requests = (lines * (1 + args.requests // len(lines)))[: args.requests]
    results: dict[str, Any] = {
        "shape": args.shape,
        "threads": threads,
        "gemm_peak_gflops": max(peak, gemm_peak(threads)),
        "load_average": os.getloadavg()[0],
    }
    for tokens in (128, 512):
        results[f"single_{tokens}"] = await _single(r, state_of(ckpt_info.tok, tokens), args.repeat)
    results["concurrent"] = await _concurrent(r, requests, args.clients)
    flops = 0.0
    for req in requests:
        call = EngineCall(
            state=req["state"],
            model="english",
            questions=msgspec.convert(req["questions"], dict[str, Question]),
        )
        plan = r.engine.previewer.plan(call)
        flops += sum(row_flops(ckpt_info.cfg, len(row.ids)) for row in plan.rows)
    rows = sum(len(q["questions"]) for q in requests)
    for figures in results["concurrent"].values():
        gflops = flops / (rows / figures["rows_per_s"]) / 1e9
        figures["gflops"] = gflops
        figures["gemm_peak_share"] = gflops / results["gemm_peak_gflops"]
    await r.engine.aclose()
    return results


def report(results: dict[str, Any]) -> None:
    print(
        f"shape {results['shape']}, {results['threads']} threads, fp32 GEMM peak "
        f"{results['gemm_peak_gflops']:.1f} GFLOP/s; load average {results['load_average']:.1f} "
        "(other work on the machine skews every figure)"
    )
    print(f"{'run':<14}{'runtime':<9}{'rows/s':>9}{'p50 ms':>10}{'p99 ms':>10}{'speed-up':>10}")
    for run in ("single_128", "single_512", "concurrent"):
        base = results[run]["laya"]["rows_per_s"]
        for name, f in results[run].items():
            print(
                f"{run:<14}{name:<9}{f['rows_per_s']:>9.2f}{f['p50_ms']:>10.1f}"
                f"{f['p99_ms']:>10.1f}{f['rows_per_s'] / base:>9.2f}x"
            )
    for name, f in results["concurrent"].items():
        print(
            f"concurrent {name}: {f['gflops']:.1f} GFLOP/s = {100 * f['gemm_peak_share']:.0f} % "
            "of GEMM peak"
        )


def main(args: argparse.Namespace) -> int:
    from cascade.laya.tiny import write_random

    with tempfile.TemporaryDirectory(prefix="cascade-bench-") as tmp:
        root = Path(tmp)
        shape = SHAPES[args.shape]
        ckpt = write_random(
            root / "ckpt", shape=shape, vocab=50368 if shape else None, agent=ENGLISH_BUDGETS
        )
        results = asyncio.run(_bench(args, ckpt, root / "onnx"))
    report(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0
