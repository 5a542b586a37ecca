"""What happens around each example that the gallery executes.

sphinx-gallery calls :func:`around_each_example` before and after every example
(``reset_modules_order = "both"``). Before: arm a time limit and point the
example at its artefact folder. After: disarm it, free memory for the next
example, and record the provenance of the outputs that were just produced.
"""

import gc
import json
import numbers
import os
import signal
import time
from pathlib import Path

from provenance import collect_provenance, provenance_path

DEFAULT_TIMEOUT_S = 600


class ExampleTimeout(TimeoutError):
    """Raised inside an example that runs past the per-example limit."""


def around_each_example(gallery_conf, fname, when):
    if fname is None:  # called once per gallery folder, not per example
        return
    src_file = Path(gallery_conf["src_dir"], _example_dir(gallery_conf, fname), fname)
    gallery_dir = _gallery_dir(gallery_conf, fname)
    if when == "before":
        _prepare(src_file, gallery_dir)
        _start_run()
    else:
        signal.alarm(0)
        run = _finish_run(gallery_conf, src_file)
        _free_memory()
        _record_provenance(src_file, gallery_dir, run)


def timeout_seconds():
    return int(os.environ.get("COURSE_EXAMPLE_TIMEOUT", DEFAULT_TIMEOUT_S))


def artifact_dir(gallery_dir, stem):
    return Path(gallery_dir, "artifacts", stem)


def _prepare(src_file, gallery_dir):
    """Before an example: required capabilities, Triton's interpreter, artefacts, time limit.

    COURSE_REQUIRE names the capabilities this build must have, so that an example's
    skip of one fails the build: "cxx,triton,inductor" on a CPU, "cxx,nvcc,triton,inductor"
    on CUDA. A value already in the environment wins; an empty one makes a lenient build.
    """
    import torch

    strict = "cxx,nvcc,triton,inductor" if torch.cuda.is_available() else "cxx,triton,inductor"
    os.environ.setdefault("COURSE_REQUIRE", strict)
    _use_triton_interpreter_without_cuda()
    artifacts = artifact_dir(gallery_dir, src_file.stem)
    artifacts.mkdir(parents=True, exist_ok=True)
    os.environ["COURSE_ARTIFACT_DIR"] = str(artifacts)
    limit = timeout_seconds()

    def stop_hung_example(signum, frame):
        raise ExampleTimeout(
            f"{src_file.name} ran longer than the per-example limit of {limit} s "
            "(COURSE_EXAMPLE_TIMEOUT); it was stopped."
        )

    signal.signal(signal.SIGALRM, stop_hung_example)
    signal.alarm(limit)


def _use_triton_interpreter_without_cuda():
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


def _free_memory():
    import torch

    torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _record_provenance(src_file, gallery_dir, run=None):
    record = {**collect_provenance(src_file), **(run or {})}
    path = provenance_path(gallery_dir, src_file.stem)
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def _gallery_pair(gallery_conf, fname):
    """The (examples dir, gallery dir) pair that holds the example ``fname``."""
    pairs = zip(gallery_conf["examples_dirs"], gallery_conf["gallery_dirs"])
    for examples_dir, gallery_dir in pairs:
        if Path(gallery_conf["src_dir"], examples_dir, fname).is_file():
            return examples_dir, gallery_dir
    raise FileNotFoundError(f"{fname} is in none of {gallery_conf['examples_dirs']}")


def _example_dir(gallery_conf, fname):
    return _gallery_pair(gallery_conf, fname)[0]


def _gallery_dir(gallery_conf, fname):
    return Path(gallery_conf["src_dir"], _gallery_pair(gallery_conf, fname)[1])


# The GPU build's report (tools/gpu_check.py --from-build) comes from the build's
# own runs, so each example executes once: the record keeps its wall time, peak
# GPU memory and KEY_FIGURES.
_run = {}


def keep_key_figures(block, block_vars, gallery_conf):
    """An image scraper that scrapes no image: after each code block, keep the example's KEY_FIGURES."""
    figures = block_vars["example_globals"].get("KEY_FIGURES")
    if isinstance(figures, dict):
        _run["key_figures"] = {
            str(k): float(f"{v:.4g}") if isinstance(v, numbers.Real) else str(v)
            for k, v in figures.items()
        }
    return ""


def _start_run():
    import torch

    _run.clear()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    _run["start"] = time.perf_counter()


def _finish_run(gallery_conf, src_file):
    import torch

    seconds = time.perf_counter() - _run.pop("start", time.perf_counter())
    cuda = torch.cuda.is_available()
    failures = {Path(k).resolve(): v for k, v in gallery_conf["failing_examples"].items()}
    failure = failures.get(src_file.resolve())
    return {
        "passed": failure is None,
        "error": failure.strip().splitlines()[-1] if failure else None,
        "seconds": round(seconds, 2),
        "peak_gpu_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3) if cuda else None,
        "key_figures": _run.pop("key_figures", {}),
    }
