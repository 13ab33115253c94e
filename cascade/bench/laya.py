"""``cascade bench laya``: cascade's ONNX engine vs laya's torch ``Agent``, one process.

Both run the same random checkpoint (ModernBERT-base or -large shape, English budgets 512/192)
with the same thread count on the same inputs: a single request at ~128 and ~512 state tokens,
then ``--clients`` concurrent clients over the request mix (laya behind one lock, as
``laya-serve`` runs it). ``--precision fp32,int8`` runs cascade's engine once per precision in
the same run (``cascade-int8``: the int8 export) and counts the answers int8 changes on the
concurrent run's requests; it also runs those requests' rows through fp32, the served int8
export and the per-tensor reference in the same fixed batches
(``cascade.bench.int8_reference``): both int8 recipes' flips on the same rows. Prints rows/s,
p50/p99, the speed-up over laya, and each runtime's achieved GFLOP/s against the fp32 GEMM peak
measured in the same run: FLOPs of the real tokens as that runtime computes them (laya: full
attention everywhere and the whole head; cascade: banded local layers, the head's last layer at
the read positions only). A benchmark, not a test: the figures depend on the machine and on
what else runs on it.
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

from cascade.answers import demo_banner, demo_label
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
    """Multiply-adds x2 of one row of ``length`` real tokens as laya's torch runtime computes
    it: full attention in every layer, every head layer at every position."""
    e, n = cfg.encoder, length
    d, f = e.hidden, e.intermediate
    layer = 2 * n * (4 * d * d + 3 * d * f) + 4 * n * n * d
    head = 2 * n * 12 * d * d + 4 * n * n * d
    return e.layers * layer + cfg.head_layers * head


def cascade_row_flops(cfg: LayaConfig, length: int, reads: int) -> float:
    """The same as cascade's graph computes it (``cascade.laya.graph``): a local layer scores
    each chunk of ``C = window // 2`` queries against 3C keys (padded to whole chunks); the
    head's last layer computes queries, output projection and FFN at the ``reads`` positions
    only (CLS and the markers), its keys and values at every position."""
    e, n = cfg.encoder, length
    d, f, c = e.hidden, e.intermediate, max(1, e.window // 2)
    gemms = 2 * n * (4 * d * d + 3 * d * f)
    banded = 4 * (-(-n // c) * c) * 3 * c * d
    encoder = sum(gemms + (4 * n * n * d if is_global else banded) for is_global in e.global_layers)
    head = 2 * n * 12 * d * d + 4 * n * n * d
    last = 2 * n * 2 * d * d + 2 * reads * (2 * d * d + 8 * d * d) + 4 * reads * n * d
    return encoder + max(0, cfg.head_layers - 1) * head + (last if cfg.head_layers else 0)


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


class BenchRunner:
    """Both runtimes on one checkpoint, timing the same requests."""

    def __init__(self, ckpt: Path, cache: Path, threads: int, precisions: list[str]) -> None:
        import torch
        from laya import Agent

        from cascade.engines.laya import LayaEngine
        from cascade.laya.export import export
        from cascade.laya.int8 import export_int8

        torch.set_num_threads(threads)
        export(ckpt, cache=cache)
        if "int8" in precisions:
            export_int8(ckpt, cache=cache)
        copy = shutil.copytree(ckpt, cache / "laya-copy")  # laya rewrites its tokenizer config
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.agent = Agent(str(copy), device="cpu")
        self.lock = threading.Lock()
        self.engines = {
            runtime_name(p): LayaEngine(
                "laya",
                {"english": ckpt},
                onnx_cache=cache,
                intra_op_threads=threads,
                max_wait_s=0.002,
                precision=p,  # type: ignore[arg-type]
            )
            for p in precisions
        }
        self.runtimes = ["laya", *self.engines]

    def laya(self, state: Any, questions: dict) -> dict:
        with self.lock:  # laya-serve runs one forward pass at a time
            return self.agent.system_one(state, questions)

    async def run(self, runtime: str, state: Any, questions: dict) -> Any:
        """One request on ``runtime``; cascade's runtimes return their ``EngineAnswer``."""
        if runtime == "laya":
            return await asyncio.to_thread(self.laya, state, questions)
        call = EngineCall(
            state=state, questions=msgspec.convert(questions, dict[str, Question]), model="english"
        )
        return await self.engines[runtime].answer(call)


def runtime_name(precision: str) -> str:
    return "cascade" if precision == "fp32" else f"cascade-{precision}"


async def _single(r: BenchRunner, state: str, repeat: int) -> dict[str, Any]:
    for name in r.runtimes:
        await r.run(name, state, TRIAGE)
    out: dict[str, Any] = {}
    for name in r.runtimes:
        times = []
        for _ in range(repeat):
            started = time.perf_counter()
            await r.run(name, state, TRIAGE)
            times.append(time.perf_counter() - started)
        out[name] = summary(times, len(TRIAGE) * repeat, sum(times))
    return out


async def _concurrent(
    r: BenchRunner, requests: list[dict], clients: int
) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """Figures per runtime, and each cascade runtime's answers in request order."""
    out: dict[str, Any] = {}
    answers: dict[str, list[Any]] = {}
    rows = sum(len(q["questions"]) for q in requests)
    for name in r.runtimes:
        todo = list(range(len(requests)))
        latencies: list[float] = []
        got: list[Any] = [None] * len(requests)

        async def client(
            name: str = name, todo: list = todo, latencies: list = latencies, got: list = got
        ) -> None:
            while todo:
                i = todo.pop()
                started = time.perf_counter()
                got[i] = await r.run(name, requests[i]["state"], requests[i]["questions"])
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        out[name] = summary(latencies, rows, time.perf_counter() - started)
        if name != "laya":
            answers[name] = got
    return out, answers


def flips(base: list[Any], other: list[Any]) -> dict[str, float]:
    """Questions whose argmax differs between two runtimes' answers, and the largest |Δp|."""
    changed = total = 0
    worst = 0.0
    for a, b in zip(base, other, strict=True):
        for qid, ra in a.results.items():
            pa, pb = ra.probabilities, b.results[qid].probabilities
            changed += pa.index(max(pa)) != pb.index(max(pb))
            worst = max(worst, *(abs(x - y) for x, y in zip(pa, pb, strict=True)))
            total += 1
    return {"questions": total, "flips": changed, "max_dp": worst}


def _same_rows(
    ckpt: Path, cache: Path, rows: list[Any], info: Any, threads: int
) -> dict[str, dict[str, float]]:
    """Flips of the served int8 export and of the per-tensor reference on ``rows``."""
    from cascade.bench.int8_reference import per_tensor, same_rows_flips
    from cascade.laya.export import MODEL_FILE, cached_export
    from cascade.laya.int8 import cached_int8

    fp32, served = cached_export(ckpt, cache), cached_int8(ckpt, cache)
    assert fp32 is not None and served is not None  # both made by BenchRunner
    reference = per_tensor(fp32 / MODEL_FILE, cache / "per-tensor" / MODEL_FILE)
    return same_rows_flips(
        fp32 / MODEL_FILE,
        {"cascade-int8": served / MODEL_FILE, "per-tensor": reference},
        rows,
        info.cfg,
        info.tok.pad_id,
        threads=threads,
    )


async def _bench(args: argparse.Namespace, ckpt: Path, cache: Path) -> dict[str, Any]:
    threads = args.threads or default_threads()
    peak = gemm_peak(threads)  # before any model is loaded
    r = BenchRunner(ckpt, cache, threads, args.precision)
    for engine in r.engines.values():
        await engine.start()
    first = next(iter(r.engines.values()))
    ckpt_info = first.previewer.checkpoints["english"]
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
    results["concurrent"], answers = await _concurrent(r, requests, args.clients)
    if "cascade" in answers:
        results["flips"] = {
            name: flips(answers["cascade"], got)
            for name, got in answers.items()
            if name != "cascade"
        }
    planned = []
    for req in requests:
        call = EngineCall(
            state=req["state"],
            model="english",
            questions=msgspec.convert(req["questions"], dict[str, Question]),
        )
        planned += first.previewer.plan(call).rows
    if "cascade" in answers and "cascade-int8" in answers:
        results["same_rows"] = _same_rows(ckpt, cache, planned, ckpt_info, threads)
    flops = {"laya": 0.0, "cascade": 0.0}
    for row in planned:
        flops["laya"] += row_flops(ckpt_info.cfg, len(row.ids))
        flops["cascade"] += cascade_row_flops(ckpt_info.cfg, len(row.ids), 1 + len(row.markers))
    rows = sum(len(q["questions"]) for q in requests)
    for name, figures in results["concurrent"].items():
        work = flops["laya" if name == "laya" else "cascade"]
        gflops = work / (rows / figures["rows_per_s"]) / 1e9
        figures["gflops"] = gflops
        figures["gemm_peak_share"] = gflops / results["gemm_peak_gflops"]
    for engine in r.engines.values():
        await engine.aclose()
    return results


def report(results: dict[str, Any]) -> None:
    print(
        f"shape {results['shape']}, {results['threads']} threads, fp32 GEMM peak "
        f"{results['gemm_peak_gflops']:.1f} GFLOP/s; load average {results['load_average']:.1f} "
        "(other work on the machine skews every figure)"
    )
    print(f"{'run':<14}{'runtime':<14}{'rows/s':>9}{'p50 ms':>10}{'p99 ms':>10}{'speed-up':>10}")
    for run in ("single_128", "single_512", "concurrent"):
        base = results[run]["laya"]["rows_per_s"]
        for name, f in results[run].items():
            print(
                f"{run:<14}{name:<14}{f['rows_per_s']:>9.2f}{f['p50_ms']:>10.1f}"
                f"{f['p99_ms']:>10.1f}{f['rows_per_s'] / base:>9.2f}x"
            )
    for name, f in results["concurrent"].items():
        print(
            f"concurrent {name}: {f['gflops']:.1f} GFLOP/s = {100 * f['gemm_peak_share']:.0f} % "
            "of the fp32 GEMM peak (FLOPs as this runtime computes them"
            + ("; int8 dot products count as FLOPs)" if "int8" in name else ")")
        )
    others = [n for n in results["concurrent"] if n.startswith("cascade-")]
    if "cascade" in results["concurrent"] and others:
        for run in ("single_128", "single_512", "concurrent"):
            base = results[run]["cascade"]["rows_per_s"]
            ratios = ", ".join(f"{n} {results[run][n]['rows_per_s'] / base:.2f}x" for n in others)
            print(f"{run}: {ratios} the fp32 engine's rows/s")
    for name, f in results.get("flips", {}).items():
        print(
            f"{name}: {f['flips']} of {f['questions']} concurrent-run answers differ from "
            f"fp32, max |Δp| {f['max_dp']:.4f} (random weights: small margins, see docs/int8.md)"
        )
    for name, f in results.get("same_rows", {}).items():
        print(
            f"same rows, fixed batches of 8: {name} changes {f['flips']} of {f['questions']} "
            f"answers, mean |Δp| {f['mean_dp']:.4f}, max {f['max_dp']:.4f}"
        )


def main(args: argparse.Namespace) -> int:
    from cascade.laya.tiny import write_random

    with tempfile.TemporaryDirectory(prefix="cascade-bench-") as tmp:
        root = Path(tmp)
        shape = SHAPES[args.shape]
        ckpt = write_random(
            root / "ckpt", shape=shape, vocab=50368 if shape else None, agent=ENGLISH_BUDGETS
        )
        results = asyncio.run(_bench(args, ckpt, root / "onnx")) | demo_label(["laya"])
    demo_banner("bench laya", ["laya"])  # random weights by design
    report(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0
