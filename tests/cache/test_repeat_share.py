"""``cascade bench load --repeat-share``: new requests never repeat, a share R of them does."""

from __future__ import annotations

import json

from cascade.bench.load import DEFAULT_BODY, Load, fresh, matrix_table


def sent(share: float, n: int = 400) -> list[str]:
    load = Load(
        "http://127.0.0.1:1", [{"model": "m", **DEFAULT_BODY}], 1, 1.0, repeat_share=share, seed=3
    )
    return [json.dumps(load.take(), sort_keys=True) for _ in range(n)]


def test_no_request_repeats_at_r_0_and_about_half_do_at_r_one_half() -> None:
    assert len(set(sent(0.0))) == 400
    repeats = 400 - len(set(sent(0.5)))
    assert 160 <= repeats <= 240


def test_fresh_marks_every_kind_of_state() -> None:
    assert fresh({"state": "s"}, 7)["state"] == "s (ref 7)"
    assert fresh({"state": {"a": 1}}, 7)["state"] == {"a": 1, "ref": 7}
    assert fresh({"state": [{"role": "user"}]}, 7)["state"] == [{"role": "user"}, "ref 7"]
    assert fresh({"states": ["a", "b"]}, 2)["states"] == ["a (ref 2)", "b (ref 2)"]


def test_the_matrix_table_shows_ratios_to_the_first_server() -> None:
    def run(url: str, share: float, goodput: float, p50: float) -> dict:
        return {
            "url": url,
            "repeat_share": share,
            "ok": 10,
            "goodput_per_s": goodput,
            "routes": {"/v1/systemone": {"p50_ms": p50, "p99_ms": p50 * 2}},
            "cache": {"hit": 5, "miss": 5},
            "load_average": 1.0,
            "cache_metrics": {},
            "rss_mib": {},
        }

    table = matrix_table({"runs": [run("off", 0.5, 2.0, 100.0), run("on", 0.5, 4.0, 50.0)]})
    on = table.splitlines()[2]
    assert on.split()[-4:-2] == ["2.00", "0.50"]  # goodput x2, p50 x0.5
