"""Run one example as the GPU check does: in this process, then report on it as JSON.

Used by ``tools/gpu_check.py``, one process per example, so that GPU memory and
failures stay isolated. Prints the example's own output, then one line
``GPU-CHECK-RESULT {json}`` with the wall time, the peak GPU memory and the
example's ``KEY_FIGURES`` dictionary, if it defines one.
"""

import json
import runpy
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sphinxext"))
import check_margins

RESULT_MARKER = "GPU-CHECK-RESULT "  # tools/gpu_check.py reads it


def run(path):
    """As a reader runs it: no TRITON_INTERPRET set here, the example sets what it needs."""
    cuda = torch.cuda.device_count() > 0  # NVML: is_available() would start CUDA before lecture 7 forks
    log = Path(tempfile.mkstemp(suffix=".margins.jsonl")[1])
    check_margins.install(log)
    start = time.perf_counter()
    result = {"passed": True, "error": None, "key_figures": {}}
    try:
        namespace = runpy.run_path(path, run_name="__main__")
        result["key_figures"] = _plain(namespace.get("KEY_FIGURES", {}))
    except BaseException as error:  # noqa: BLE001 - a failing example is a result, not a crash
        result["passed"] = False
        result["error"] = "".join(traceback.format_exception_only(error)).strip()
        traceback.print_exc()
    result["margins"] = check_margins.table(check_margins.read(log))
    log.unlink(missing_ok=True)
    result["seconds"] = round(time.perf_counter() - start, 2)
    result["peak_gpu_memory_gib"] = (
        round(torch.cuda.max_memory_allocated() / 2**30, 3) if cuda else None
    )
    print(RESULT_MARKER + json.dumps(result), flush=True)


def _plain(figures):
    """Numbers to four significant digits, everything else as text, so the report is JSON."""
    return {
        str(k): float(f"{v:.4g}") if isinstance(v, (int, float)) else str(v)
        for k, v in figures.items()
    }


if __name__ == "__main__":
    run(sys.argv[1])
