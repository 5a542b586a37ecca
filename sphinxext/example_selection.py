"""Which examples a build executes: ``COURSE_LECTURES`` and ``COURSE_EXAMPLES``.

``COURSE_EXAMPLES`` (``make html EXAMPLES=...``) is a regular expression searched
for in each example's file name: ``06`` picks every example numbered 06,
``torch_compile`` picks ``06_torch_compile.py``, ``^0[12]_`` the first two of each
lecture. ``COURSE_LECTURES`` is a comma-separated list of lecture folders, as one
shard of the GPU build uses. A pattern that matches nothing is an error that
names the examples there are, never a build that silently executes none.

Used by the build (``example_runner``) and by ``tools/gpu_check.py``, which must
choose exactly as the build does; it needs nothing but the standard library.
"""

import re


class SelectionError(ValueError):
    """COURSE_LECTURES or COURSE_EXAMPLES names nothing that exists."""


def selected(examples, lectures=None, pattern=None):
    """The examples (paths ``.../<lecture>/NN_topic.py``) that the two variables choose."""
    known = sorted({e.parent.name for e in examples})
    wanted = [name for name in (lectures or "").split(",") if name] or known
    if unknown := sorted(set(wanted) - set(known)):
        raise SelectionError(f"unknown lecture(s) {', '.join(unknown)}; the lectures are {', '.join(known)}")
    try:
        regex = re.compile(pattern) if pattern else None
    except re.error as error:
        raise SelectionError(f"EXAMPLES={pattern!r} is not a regular expression: {error}") from None
    chosen = [e for e in examples if e.parent.name in wanted and (regex is None or regex.search(e.name))]
    if not chosen:
        stems = "\n".join(f"    {e.stem}" for e in sorted(examples, key=lambda e: e.stem))
        raise SelectionError(f"EXAMPLES={pattern!r} matches no example's file name"
                             f"{' in ' + ', '.join(wanted) if lectures else ''}. The examples are:\n{stems}")
    return chosen


def filename_pattern(chosen):
    """sphinx-gallery's ``filename_pattern`` (searched in each path) for exactly these examples."""
    return "|".join(rf"/{re.escape(e.parent.name)}/{re.escape(e.name)}$" for e in chosen)


if __name__ == "__main__":  # make html checks the selection before Sphinx starts
    import os
    import sys
    from pathlib import Path

    examples = sorted(Path(__file__).resolve().parents[1].glob("examples/lecture*/[0-9][0-9]_*.py"))
    lectures, pattern = os.environ.get("COURSE_LECTURES"), os.environ.get("COURSE_EXAMPLES")
    if lectures or pattern:
        try:
            chosen = selected(examples, lectures, pattern)
        except SelectionError as error:
            sys.exit(f"make html: {error}")
        print(f"Executing {len(chosen)} of {len(examples)} examples: {', '.join(e.stem for e in chosen)}")
