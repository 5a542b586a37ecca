"""Run every example at full size, one process each, and write a report.

On a CUDA machine this is the check of the GPU build machine; on a CPU it is the
same check at CPU sizes. It needs only torch (triton, numpy and matplotlib as
the examples use them), so it runs on a machine without Sphinx or a network.

    python tools/gpu_check.py --out docs/gpu-report     # writes report.json and report.md

The same report can come from a build's own runs instead, so that the GPU build
executes each example once (tools/gpu_build.sh), and the reports of several
shards of that build can be merged into one:

    python tools/gpu_check.py --from-build source/auto_examples --out OUT
    python tools/gpu_check.py --merge OUT1 OUT2 --out _build/gpu-report
"""

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "sphinxext"))

import check_margins
from example_selection import SelectionError, selected
from provenance import cpu_model, git_commit

EXAMPLES = sorted(REPO.glob("examples/lecture*/[0-9][0-9]_*.py"))
RESULT_MARKER = "GPU-CHECK-RESULT "  # as tools/run_one_example.py prints it; importing it would import torch

# The lectures' targets for the course's own kernels on a GPU, as key figures the
# examples report: (name pattern, lowest fraction that meets the target, what it compares).
TARGETS = [
    (r"add_best_fraction_of_copy_bw", 0.90, "Triton vector add / measured copy bandwidth"),
    (r"softmax_triton_N\d+_fraction_of_copy_bw", 0.90, "Triton softmax / measured copy bandwidth"),
    (r"gelu_(triton|cuda)_fraction_of_copy_bw", 0.90, "GELU kernel / measured copy bandwidth"),
    (r"ours_gelu_fraction_of_copy_bw", 0.90, "CUDA GELU / measured copy bandwidth"),
    (r"matmul_triton_fraction_of_torch_\w+", 0.90, "Triton matmul / torch.matmul"),
    (r"triton_over_sdpa_d\d+_N\d+", 0.60, "Triton attention / scaled_dot_product_attention"),
]


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


def chosen_examples(lectures=None, pattern=None):
    """The examples a build executes, chosen as the build chooses them (COURSE_LECTURES, COURSE_EXAMPLES)."""
    try:
        return selected(EXAMPLES, lectures, pattern)
    except SelectionError as error:
        raise SystemExit(str(error)) from None


def results_from_build(generated, examples):
    """Each example's result as the build's runner recorded it when it executed the example."""
    results = {}
    for example in examples:
        gallery = generated / example.parent.name
        record_file = gallery / "provenance" / f"{example.stem}.json"
        if not record_file.is_file():
            results[f"{example.parent.name}/{example.name}"] = failure("not executed by the build", 0)
            continue
        record = json.loads(record_file.read_text())
        # sphinx-gallery writes the .md5 only after a run that raised nothing.
        passed = record.get("passed", False) and (gallery / f"{example.name}.md5").is_file()
        results[f"{example.parent.name}/{example.name}"] = {
            "passed": passed,
            "error": None if passed else record.get("error") or "failed in the build",
            "seconds": record.get("seconds", 0),
            "peak_gpu_memory_gib": record.get("peak_gpu_memory_gib"),
            "key_figures": record.get("key_figures", {}),
            "margins": record.get("margins", []),
        }
    return results


def against_targets(results, on_gpu):
    """Every key figure that has a target, with the target and whether it was met."""
    rows = []
    for name, result in results.items():
        for figure, value in result["key_figures"].items():
            for pattern, target, compares in TARGETS:
                if re.fullmatch(pattern, figure) and isinstance(value, (int, float)):
                    met = value >= target if on_gpu else None
                    rows.append({"example": name, "figure": figure, "value": value, "target": target,
                                 "compares": compares, "met": met})
    return rows


def make_report(results, total_seconds, shards=1):
    m = machine()
    return {
        "machine": m,
        "examples": results,
        "passed": sum(r["passed"] for r in results.values()),
        "total_seconds": round(total_seconds, 1),
        "shards": shards,
        "targets": against_targets(results, on_gpu=not m["device"].startswith("CPU")),
    }


def merge(reports):
    """One report from the reports of several shards of one build."""
    merged = {**reports[0], "examples": {}, "targets": []}
    for report in reports:
        merged["examples"].update(report["examples"])
        merged["targets"] += report.get("targets", [])
    merged["passed"] = sum(r["passed"] for r in merged["examples"].values())
    merged["total_seconds"] = round(sum(r["total_seconds"] for r in reports), 1)
    merged["shards"] = sum(r.get("shards", 1) for r in reports)
    devices = sorted({r["machine"]["device"] for r in reports})
    if len(devices) > 1:
        merged["machine"] = {**merged["machine"], "device": " + ".join(devices)}
    return merged


def write(report, out):
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "report.md").write_text(markdown(report))


def markdown(report):
    m = report["machine"]
    shards = report.get("shards", 1)
    lines = [
        "# GPU check report",
        "",
        (f"Machine: **{m['device']}**, torch {m['torch']}, CUDA {m['cuda']}, Python {m['python']},"
        f" {m['date']}, commit `{m['commit']}`."),
        "",
        (f"{report['passed']} of {len(report['examples'])} examples passed in"
        f" {report['total_seconds']:.0f} s" + (f" (the sum of {shards} shards)." if shards > 1 else ".")),
        "",
        "| example | result | wall time (s) | peak GPU memory (GiB) | key figures |",
        "| --- | --- | ---: | ---: | --- |",
    ]
    for name, r in report["examples"].items():
        result = "pass" if r["passed"] else f"FAIL: {r['error']}"
        memory = "" if r["peak_gpu_memory_gib"] is None else f"{r['peak_gpu_memory_gib']:.2f}"
        figures = "; ".join(f"{k} = {v}" for k, v in r["key_figures"].items())
        lines.append(f"| `{name}` | {result} | {r['seconds']:.1f} | {memory} | {figures} |")
    if report.get("targets"):
        lines += ["", "## Key figures against the targets", ""]
        if any(t["met"] is None for t in report["targets"]):
            lines += ["The targets are for a GPU; a CPU's figures are listed, not judged.", ""]
        lines += ["| example | key figure | compares | value | target | met |",
                  "| --- | --- | --- | ---: | ---: | --- |"]
        for t in report["targets"]:
            met = {True: "yes", False: "**no**", None: "n/a (CPU)"}[t["met"]]
            lines.append(f"| `{t['example']}` | `{t['figure']}` | {t['compares']} | {t['value']:.3g}"
                         f" | {t['target']:.2f} | {met} |")
    margins = sorted((row for r in report["examples"].values() for row in r.get("margins", [])),
                     key=lambda row: -row["use"])
    if margins:
        lines += ["", "## How much of its tolerance each check used", "",
                  ("Each `assert_close`: its worst error over the error it allowed. Above 0.5 a check"
                  " keeps less than 2x headroom; above 1 it fails."), "", check_margins.markdown(margins)]
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "_build" / "gpu-check")
    parser.add_argument("--timeout", type=int, default=240, help="seconds per example")
    parser.add_argument("examples", nargs="*", help="file-name stems to check (default: all)")
    parser.add_argument("--from-build", type=Path, metavar="GENERATED",
                        help="report on the examples a build executed (its source/auto_examples)"
                        " instead of running them; COURSE_LECTURES and COURSE_EXAMPLES say which")
    parser.add_argument("--build-seconds", type=float, help="with --from-build: the build's wall time")
    parser.add_argument("--merge", type=Path, nargs="+", metavar="OUT",
                        help="merge the reports in these folders (shards of one build)")
    parser.add_argument("--list", action="store_true",
                        help="print the examples COURSE_LECTURES and COURSE_EXAMPLES choose, and stop")
    args = parser.parse_args()

    if args.list:
        chosen = chosen_examples(os.environ.get("COURSE_LECTURES"), os.environ.get("COURSE_EXAMPLES"))
        print("\n".join(f"{e.parent.name}/{e.name}" for e in chosen))
        return 0 if chosen else 1
    if args.merge:
        report = merge([json.loads((out / "report.json").read_text()) for out in args.merge])
    elif args.from_build:
        chosen = chosen_examples(os.environ.get("COURSE_LECTURES"), os.environ.get("COURSE_EXAMPLES"))
        results = results_from_build(args.from_build, chosen)
        report = make_report(results, args.build_seconds or sum(r["seconds"] for r in results.values()))
    else:
        chosen = [e for e in EXAMPLES if not args.examples or e.stem in args.examples]
        start = time.perf_counter()
        results = {}
        for example in chosen:
            name = f"{example.parent.name}/{example.name}"
            results[name] = check(example, args.timeout)
            verdict = "pass" if results[name]["passed"] else "FAIL"
            print(f"{verdict}  {results[name]['seconds']:7.1f} s  {name}", flush=True)
        report = make_report(results, time.perf_counter() - start)
    write(report, args.out)
    if args.merge or args.from_build:
        for name, r in report["examples"].items():
            print(f"{'pass' if r['passed'] else 'FAIL'}  {r['seconds']:7.1f} s  {name}")
    print(f"\n{report['passed']}/{len(report['examples'])} passed in {report['total_seconds']} s;"
          f" report in {args.out}")
    return 0 if report["passed"] == len(report["examples"]) else 1


if __name__ == "__main__":
    sys.exit(main())
