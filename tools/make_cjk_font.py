"""The Chinese font of the figures: a subset of Noto Sans CJK SC, vendored in fonts/.

The Chinese programs draw Chinese titles, labels and legends, and matplotlib ships no
font with Chinese glyphs. This keeps a subset of Noto Sans CJK SC Regular (SIL Open
Font License 1.1, fonts/OFL.txt) small enough to vendor: the 3,755 characters of
GB 2312's first level, CJK punctuation and full-width forms, and every other character
that the catalogs' program messages use.

    python tools/make_cjk_font.py      # after a translation brings a character it lacks

It reads Debian's fonts-noto-cjk (``make test`` installs it); tests/test_fonts.py says
when the subset lacks a character that a program message uses.
"""

import sys
from pathlib import Path

from babel.messages.pofile import read_po
from fontTools import subset
from fontTools.ttLib import TTCollection

REPO = Path(__file__).resolve().parent.parent
SOURCE = Path("/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc")
FAMILY = "Noto Sans CJK SC"
SUBSET_FAMILY = "Noto Sans SC Course"  # its own name: matplotlib must not take the system's full font for it
OUTPUT = REPO / "fonts" / "NotoSansCJKsc-Regular-subset.otf"
CATALOGS = REPO / "locale" / "zh_CN" / "LC_MESSAGES" / "auto_examples"


def gb2312_level_one():
    """The 3,755 most common characters: GB 2312 rows 16 to 55."""
    found = []
    for row in range(0xB0, 0xD8):
        for cell in range(0xA1, 0xFF):
            try:
                found.append(bytes([row, cell]).decode("gb2312"))
            except UnicodeDecodeError:
                continue
    return found


def wide(text):
    """The characters of ``text`` outside ASCII and Latin-1 (DejaVu Sans draws those)."""
    return {c for c in text if ord(c) > 0x2E7F}


def program_characters(catalogs=CATALOGS):
    """Every wide character of the program messages' translations."""
    found = set()
    for path in sorted(catalogs.rglob("*.po")):
        with path.open("rb") as f:
            found |= {c for m in read_po(f) if m.context == "program" and m.string for c in wide(m.string)}
    return found


def wanted():
    punctuation = {chr(c) for c in range(0x3000, 0x3040)} | {chr(c) for c in range(0xFF01, 0xFF5F)}
    return set(gb2312_level_one()) | punctuation | program_characters() | set("—…“”‘’·×")


def licence(font):
    """fonts/OFL.txt: the font's copyright notice and the licence's text, from Debian's copyright file."""
    lines = Path("/usr/share/doc/fonts-noto-cjk/copyright").read_text(encoding="utf-8").splitlines()
    start = lines.index("License: SIL-1.1", lines.index("License: SIL-1.1") + 1) + 1
    end = next(i for i in range(start, len(lines)) if lines[i] and not lines[i].startswith(" "))
    text = "\n".join("" if line.strip() == "." else line[1:] for line in lines[start:end]).strip()
    notice = font["name"].getDebugName(0)
    return (f"{notice}\n\nThe file {OUTPUT.name} is a subset of {FAMILY} Regular"
            f" (https://github.com/notofonts/noto-cjk), made by tools/make_cjk_font.py.\n\n{text}\n")


def main():
    if not SOURCE.exists():
        sys.exit(f"{SOURCE} is missing: install Debian's fonts-noto-cjk (make browser-deps does)")
    collection = TTCollection(str(SOURCE))
    font = next(f for f in collection.fonts if f["name"].getDebugName(1) == FAMILY)
    options = subset.Options()
    options.layout_features = ["*"]
    options.name_IDs = ["*"]
    options.notdef_outline = True
    subsetter = subset.Subsetter(options)
    subsetter.populate(unicodes=[ord(c) for c in sorted(wanted())])
    subsetter.subset(font)
    names = font["name"]
    for record in list(names.names):
        if record.nameID in (1, 16):
            names.setName(SUBSET_FAMILY, record.nameID, record.platformID, record.platEncID, record.langID)
        elif record.nameID in (3, 4):
            names.setName(f"{SUBSET_FAMILY} Regular", record.nameID, record.platformID, record.platEncID,
                          record.langID)
        elif record.nameID == 6:
            names.setName(SUBSET_FAMILY.replace(" ", "") + "-Regular", 6, record.platformID,
                          record.platEncID, record.langID)
    OUTPUT.parent.mkdir(exist_ok=True)
    (OUTPUT.parent / "OFL.txt").write_text(licence(font), encoding="utf-8")
    font.save(str(OUTPUT))
    print(f"{OUTPUT.relative_to(REPO)}: {len(font.getBestCmap())} characters, {OUTPUT.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
