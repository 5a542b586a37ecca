"""The Chinese figures have their glyphs: the vendored font holds every character that
the programs' translations use, and matplotlib draws them with it without a missing glyph."""

import io
import re
import sys
import warnings

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from fontTools.ttLib import TTFont
from matplotlib import font_manager

from tools.site_build import REPO

sys.path.insert(0, str(REPO / "tools"))
import make_cjk_font

FONT = make_cjk_font.OUTPUT


def test_the_font_holds_every_character_of_the_program_messages():
    have = set(map(chr, TTFont(str(FONT)).getBestCmap()))
    used = make_cjk_font.program_characters()
    assert len(used) > 500, len(used)
    missing = "".join(sorted(used - have))
    assert not missing, (f"{FONT.name} lacks {missing!r}, used by the programs' translations:"
                         " run python tools/make_cjk_font.py")


def test_matplotlib_finds_this_file_by_its_name():
    font_manager.fontManager.addfont(str(FONT))
    found = font_manager.findfont(font_manager.FontProperties(family=make_cjk_font.SUBSET_FAMILY),
                                  fallback_to_default=False)
    assert found == str(FONT)


def test_its_licence_comes_with_it():
    text = (FONT.parent / "OFL.txt").read_text(encoding="utf-8")
    assert "SIL OPEN FONT LICENSE Version 1.1" in text and "Adobe" in text


def draw(text, families):
    """Draw ``text`` as a title, label and legend; the warnings matplotlib gave."""
    font_manager.fontManager.addfont(str(FONT))
    with warnings.catch_warnings(record=True) as caught, plt.rc_context({"font.family": families}):
        warnings.simplefilter("always")
        fig, ax = plt.subplots()
        ax.plot([0, 1], label=text[:40])
        ax.set_title(text[:40])
        ax.set_xlabel(text[40:80])
        ax.legend()
        fig.savefig(io.BytesIO(), format="png")
        plt.close(fig)
    return [str(w.message) for w in caught if re.search(r"Glyph \d+ .*missing", str(w.message))]


@pytest.mark.parametrize("families, fails", [
    (["DejaVu Sans", make_cjk_font.SUBSET_FAMILY], False),
    (["DejaVu Sans"], True),  # planted: without the font, the same text misses its glyphs
])
def test_matplotlib_draws_the_chinese_labels_with_it(families, fails):
    text = "".join(sorted(make_cjk_font.program_characters()))
    missing = [draw(text[i:i + 80], families) for i in range(0, len(text), 80)]
    missing = [m for chunk in missing for m in chunk]
    assert bool(missing) == fails, missing[:3]
