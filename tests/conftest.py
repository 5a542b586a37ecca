"""One clean build of the whole site, shared by the tests that inspect it."""

import pytest

from tools.site_build import copy_checkout, make


@pytest.fixture(scope="session")
def site(tmp_path_factory):
    """A fresh checkout copy, built from scratch with ``make html``."""
    checkout = copy_checkout(tmp_path_factory.mktemp("site"))
    result = make(checkout, "html")
    if result.returncode != 0:
        pytest.fail(f"make html failed:\n{result.log[-6000:]}")
    return checkout, result
