"""How much of its tolerance each numeric check of an example uses.

Every numeric correctness check in ``examples/`` goes through
``torch.testing.assert_close``. :func:`install` wraps it, in the build's process
and in every standalone run, so that each call also appends one JSON line to the
file named by ``COURSE_MARGIN_LOG``: where the call stands (example file and
line), and its *margin use*, the worst element's error over the error it was
allowed,

    max_i |actual_i - expected_i| / (atol + rtol * |expected_i|),

with ``assert_close``'s own default tolerances where the call names none. A
margin use of 0.5 means the check kept 2x headroom; above 1 it fails. Ranks
forked by lecture 7 inherit the wrapper and append to the same file (one short
``write`` per line, so lines from several processes do not interleave).

:func:`table` reads such a log back: one row per check, its worst margin use.
The examples themselves never import this module; each stays standalone.
"""

import json
import math
import os
import sys
from pathlib import Path

LOG_VARIABLE = "COURSE_MARGIN_LOG"
HEADROOM = 0.5  # a check may use at most half of its tolerance (tests/test_portability.py)

_HERE = Path(__file__).resolve()


def install(log_path=None):
    """Wrap ``torch.testing.assert_close`` so that each call is logged; returns the log's path."""
    import torch

    if log_path is not None:
        os.environ[LOG_VARIABLE] = str(log_path)
    original = torch.testing.assert_close
    if getattr(original, "_logs_margins", False):
        return os.environ.get(LOG_VARIABLE)

    def assert_close(actual, expected, *args, **kwargs):
        try:
            row = _measure(actual, expected, kwargs)
        except Exception:  # noqa: BLE001 - a comparison we cannot measure is assert_close's to judge
            row = None
        try:
            return original(actual, expected, *args, **kwargs)
        finally:
            if row is not None:
                _append(row)

    assert_close._logs_margins = True
    assert_close.__doc__ = original.__doc__
    torch.testing.assert_close = assert_close
    return os.environ.get(LOG_VARIABLE)


def _measure(actual, expected, kwargs):
    import torch
    from torch.testing._comparison import default_tolerances
    from torch.utils._pytree import tree_flatten

    actual_leaves, actual_spec = tree_flatten(actual)
    expected_leaves, expected_spec = tree_flatten(expected)
    if actual_spec != expected_spec:
        return None
    worst, dtype, count = 0.0, None, 0
    for a, e in zip(actual_leaves, expected_leaves):
        if not isinstance(a, torch.Tensor):
            if not isinstance(a, (int, float)) or isinstance(a, bool):
                continue
            a = torch.tensor(a, dtype=torch.float64 if isinstance(a, float) else None)
        if not isinstance(e, torch.Tensor):
            e = torch.tensor(e, dtype=torch.float64 if isinstance(e, float) else None)
        if a.shape != e.shape or a.is_complex() or e.is_complex():
            return None
        if not (a.is_floating_point() or e.is_floating_point()):
            continue  # integers are compared exactly: no tolerance to use
        rtol, atol = kwargs.get("rtol"), kwargs.get("atol")
        if rtol is None or atol is None:
            rtol, atol = default_tolerances(a, e)
        diff = (a.detach().double().cpu() - e.detach().double().cpu()).abs()
        allowed = atol + rtol * e.detach().double().cpu().abs()
        if kwargs.get("equal_nan"):
            diff = torch.where(torch.isnan(diff), torch.zeros_like(diff), diff)
        if diff.numel():
            use = torch.where(allowed > 0, diff / allowed.clamp_min(1e-300),
                              torch.where(diff > 0, math.inf, 0.0))
            use = torch.where(torch.isnan(use), math.inf, use)
            worst = max(worst, use.max().item())
        dtype = str(a.dtype).removeprefix("torch.")
        count += a.numel()
    if dtype is None:
        return None
    file, line = _caller()
    return {"file": file, "line": line, "use": worst, "dtype": dtype, "elements": count}


def _caller():
    """The first frame outside torch and this module: the example's line that called assert_close."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith("<") and Path(name).resolve() != _HERE and f"{os.sep}torch{os.sep}" not in name:
            return Path(name).name, frame.f_lineno
        frame = frame.f_back
    return "?", 0


def _append(row):
    path = os.environ.get(LOG_VARIABLE)
    if not path:
        return
    row = {**row, "use": row["use"] if math.isfinite(row["use"]) else "inf"}
    line = (json.dumps(row) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read(path):
    """The rows of a margin log (or of several), with ``use`` as a float."""
    rows = []
    for one in [path] if isinstance(path, (str, Path)) else path:
        if not Path(one).is_file():
            continue
        for text in Path(one).read_text().splitlines():
            row = json.loads(text)
            row["use"] = float(row["use"])
            rows.append(row)
    return rows


def table(rows, **labels):
    """One row per check (file, line): calls, elements of the worst call, worst margin use, dtype."""
    checks = {}
    for row in rows:
        key = (row["file"], row["line"])
        seen = checks.setdefault(key, {"file": row["file"], "line": row["line"], "calls": 0,
                                       "use": -1.0, "dtype": row["dtype"], **labels})
        seen["calls"] += 1
        if row["use"] > seen["use"]:
            seen.update(use=row["use"], dtype=row["dtype"], elements=row["elements"])
    return sorted(checks.values(), key=lambda c: -c["use"])


def markdown(checks, limit=None):
    """The worst checks first, as a Markdown table."""
    keys = [k for k in ("cell",) if any(k in c for c in checks)]
    head = ["check", *keys, "calls", "dtype", "worst margin use"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for c in checks[:limit]:
        cells = [f"`{c['file']}:{c['line']}`", *(str(c.get(k, "")) for k in keys), str(c["calls"]),
                 c["dtype"], f"{c['use']:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
