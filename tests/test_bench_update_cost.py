"""benchmarks/bench_cost_growth.py end to end on the tiny random model (a smoke check of the scripts and their JSON; their timings are not tested)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(script: str, *args: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], check=True, cwd=ROOT, env=env,
                   timeout=600, capture_output=True)


def test_cost_growth_tiny(tmp_path) -> None:
    stem = tmp_path / "cost_growth"
    _run("bench_cost_growth.py", "--model", "tiny-random", "--trainable-layers", "1", "--quick", "--out", str(stem))
    data = json.loads(stem.with_suffix(".json").read_text())
    assert stem.with_suffix(".png").is_file()
    axes = {p["axis"] for p in data["points"]}
    assert axes == {"episodes", "group size", "turns", "prompt tokens"}
    for p in data["points"]:
        assert set(p["phases"]) == ({"decode", "teacher"} if p["axis"] == "group size" else
                                    {"decode", "teacher", "update"})
        assert all(v["cpu_s"] > 0 for v in p["phases"].values())
    assert "grow" in data["summary"]
