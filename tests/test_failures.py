"""A broken or hung example fails the build, and the build names it."""

import re

import pytest

from tools.site_build import copy_checkout, make

BROKEN = '''"""
Broken on purpose
=================

An example that raises, to check that the build fails loudly.
"""

def divide_by_zero():
    return 1 / 0


divide_by_zero()
'''

HUNG = '''"""
Hung on purpose
===============

An example that never finishes, to check the per-example time limit.
"""

import time

time.sleep(600)
'''


@pytest.fixture
def checkout(tmp_path):
    return copy_checkout(tmp_path / "site")


def add_example(checkout, name, text):
    (checkout / "examples" / "lecture06_kernels_triton" / name).write_text(text)


def last_lines(log):
    """What follows Sphinx's own report of the failure (make's "Error 1" line aside)."""
    assert "Extension error" in log
    tail = log[log.rindex("Extension error"):].splitlines()
    return "\n".join(line for line in tail if not line.startswith("make"))


def test_raising_example_fails_the_build_and_names_it(checkout):
    add_example(checkout, "98_broken.py", BROKEN)
    result = make(checkout, "html", EXAMPLES="98_broken")
    assert result.returncode != 0
    assert "98_broken.py" in result.log
    assert "ZeroDivisionError" in result.log
    assert "divide_by_zero" in result.log  # the traceback, not only the message

    # The last lines, after Sphinx's own report: the example, its traceback, what to do.
    tail = last_lines(result.log)
    summary = tail[tail.index("The build failed"):]
    assert "examples/lecture06_kernels_triton/98_broken.py" in summary
    assert "divide_by_zero()" in summary and "ZeroDivisionError: division by zero" in summary
    assert "What to do next" in summary
    assert "python examples/lecture06_kernels_triton/98_broken.py" in summary  # how to reproduce it
    assert "make html EXAMPLES=98_broken" in summary
    assert summary.rstrip().endswith("The full log is above.")

    # Mended, it executes again, and the build starts from what the failed one read
    # (Sphinx drops its pickled environment on an error; the runner puts it back), so it
    # reads only the pages whose sources changed, not every page as a new one.
    add_example(checkout, "98_broken.py", BROKEN.replace("return 1 / 0", "return 1 / 1"))
    mended = make(checkout, "html", EXAMPLES="98_broken", EDITIONS="en")
    assert mended.returncode == 0, mended.log[-3000:]
    assert mended.examples_executed == 1
    plain = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", mended.log)  # Sphinx colours its log where CI=true
    update = re.search(r"^updating environment: (.*)$", plain, flags=re.MULTILINE)
    assert update and "[new config]" not in update[1], update
    assert re.match(r"0 added, \d+ changed, 0 removed", update[1]), update[1]


def test_hung_example_is_stopped_with_a_clear_message(checkout):
    add_example(checkout, "99_hung.py", HUNG)
    result = make(checkout, "html", EXAMPLES="99_hung", env={"COURSE_EXAMPLE_TIMEOUT": "3"})
    assert result.returncode != 0
    assert "99_hung.py ran longer than the per-example limit of 3 s" in result.log
    assert result.seconds < 300  # the example sleeps 600 s; the rest is the build, on a busy machine
    assert "COURSE_EXAMPLE_TIMEOUT=1200" in last_lines(result.log)  # how to allow it longer
