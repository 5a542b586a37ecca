"""A broken or hung example fails the build, and the build names it."""

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


def test_raising_example_fails_the_build_and_names_it(checkout):
    add_example(checkout, "98_broken.py", BROKEN)
    result = make(checkout, "html", EXAMPLES="98_broken")
    assert result.returncode != 0
    assert "98_broken.py" in result.log
    assert "ZeroDivisionError" in result.log
    assert "divide_by_zero" in result.log  # the traceback, not only the message


def test_hung_example_is_stopped_with_a_clear_message(checkout):
    add_example(checkout, "99_hung.py", HUNG)
    result = make(checkout, "html", EXAMPLES="99_hung", env={"COURSE_EXAMPLE_TIMEOUT": "3"})
    assert result.returncode != 0
    assert "99_hung.py ran longer than the per-example limit of 3 s" in result.log
    assert result.seconds < 120
