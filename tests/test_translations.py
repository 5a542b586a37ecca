"""The Chinese edition is complete and current: every message of every page is translated."""

import subprocess
import sys

import pytest
from babel.messages.pofile import read_po

from tools.catalog_stats import LOCALE, all_stats
from tools.site_build import copy_checkout


def test_every_catalog_is_fully_translated():
    stats = all_stats()
    assert stats, "no catalogs"
    incomplete = {name: s for name, s in stats.items() if s[1] or s[2]}
    assert not incomplete, f"(translated, untranslated, fuzzy): {incomplete}"


@pytest.fixture(scope="module")
def templates(tmp_path_factory):
    """The messages the English pages have now, extracted afresh with the gettext builder."""
    checkout = copy_checkout(tmp_path_factory.mktemp("gettext"))
    out = checkout / "_build" / "gettext"
    subprocess.run(
        [sys.executable, "-m", "sphinx", "-c", ".", "-b", "gettext", "-D", "plot_gallery=0",
         "-q", "source", str(out)],
        cwd=checkout, check=True, capture_output=True,
    )
    return out


def test_catalogs_are_current(templates):
    pages = sorted(templates.rglob("*.pot"))
    assert pages
    for pot in pages:
        name = pot.relative_to(templates).with_suffix(".po")
        po = LOCALE / name
        assert po.is_file(), f"no catalog for {name}: run make translations"
        with open(pot, "rb") as f:
            wanted = {m.id for m in read_po(f) if m.id}
        with open(po, "rb") as f:
            have = {m.id for m in read_po(f) if m.id and m.string and not m.fuzzy}
        missing = wanted - have
        assert not missing, f"{name}: {len(missing)} messages not translated, e.g. {sorted(missing)[:2]}"
