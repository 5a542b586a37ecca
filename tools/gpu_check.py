"""Run every example at full size, one process each, and write a report.

On a CUDA machine this is the check of the GPU build machine; on a CPU it is the
same check at CPU sizes. It needs only torch (triton, numpy and matplotlib as
the examples use them), so it runs on a machine without Sphinx or a network.

    python tools/gpu_check.py --out docs/gpu-report     # writes report.json and report.md
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "sphinxext"))

from provenance import cpu_model, git_commit
from run_one_example import RESULT_MARKER

EXAMPLES = sorted(REPO.glob("examples/lecture*/[0-9][0-9]_*.py"))


def machine():
    import torch

    cuda = torch.cuda.is_available()
    return {
        "device": torch.cuda.get_device_name() if cuda else f"CPU: {cpu_model()}",
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "none",
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_commit(REPO),
    }


def check(example, timeout):
    env = {**os.environ, "MPLBACKEND": "Agg"}
    start = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, str(REPO / "tools" / "run_one_example.py"), str(example)],
            cwd=example.parent, env=env, capture_output=True, text=True, timeout=timeout, check=False,
        )
    except subprocess.TimeoutExpired:
        return failure(f"timed out after {timeout} s", timeout)
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(RESULT_MARKER):
            return json.loads(line[len(RESULT_MARKER):])
    last_line = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return failure(f"process exited with {done.returncode}: {last_line}",
                   round(time.perf_counter() - start, 2))


def failure(error, seconds):
    return {"passed": False, "error": error, "seconds": seconds,
            "peak_gpu_memory_gib": None, "key_figures": {}}


def markdown(report):
    m = report["machine"]
    lines = [
        "# GPU check report",
        "",
        (f"Machine: **{m['device']}**, torch {m['torch']}, CUDA {m['cuda']}, Python {m['python']},"
        f" {m['date']}, commit `{m['commit']}`."),
        "",
        (f"{report['passed']} of {len(report['examples'])} examples passed in"
        f" {report['total_seconds']:.0f} s."),
        "",
        "| example | result | wall time (s) | peak GPU memory (GiB) | key figures |",
        "| --- | --- | ---: | ---: | --- |",
    ]
    for name, r in report["examples"].items():
        result = "pass" if r["passed"] else f"FAIL: {r['error']}"
        memory = "" if r["peak_gpu_memory_gib"] is None else f"{r['peak_gpu_memory_gib']:.2f}"
        figures = "; ".join(f"{k} = {v}" for k, v in r["key_figures"].items())
        lines.append(f"| `{name}` | {result} | {r['seconds']:.1f} | {memory} | {figures} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "_build" / "gpu-check")
    parser.add_argument("--timeout", type=int, default=240, help="seconds per example")
    parser.add_argument("examples", nargs="*", help="file-name stems to check (default: all)")
    args = parser.parse_args()

    chosen = [e for e in EXAMPLES if not args.examples or e.stem in args.examples]
    start = time.perf_counter()
    results = {}
    for example in chosen:
        name = f"{example.parent.name}/{example.name}"
        results[name] = check(example, args.timeout)
        verdict = "pass" if results[name]["passed"] else "FAIL"
        print(f"{verdict}  {results[name]['seconds']:7.1f} s  {name}", flush=True)
    report = {
        "machine": machine(),
        "examples": results,
        "passed": sum(r["passed"] for r in results.values()),
        "total_seconds": round(time.perf_counter() - start, 1),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "report.md").write_text(markdown(report))
    print(f"\n{report['passed']}/{len(results)} passed in {report['total_seconds']} s;"
          f" report in {args.out}")
    return 0 if report["passed"] == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
