"""Translation status of every catalog in locale/zh_CN: translated, untranslated, fuzzy.

Exits non-zero when any message is untranslated or fuzzy, or a catalog's header is
still marked fuzzy, so it can gate a build.
"""

import sys
from pathlib import Path

from babel.messages.pofile import read_po

LOCALE = Path(__file__).resolve().parents[1] / "locale" / "zh_CN" / "LC_MESSAGES"


def read_catalog(po_file):
    with open(po_file, "rb") as f:
        return read_po(f)


def catalog_stats(po_file):
    catalog = read_catalog(po_file)
    messages = [m for m in catalog if m.id]
    fuzzy = sum(m.fuzzy for m in messages)
    untranslated = sum(not m.string and not m.fuzzy for m in messages)
    return len(messages) - fuzzy - untranslated, untranslated, fuzzy


def all_stats():
    return {p.relative_to(LOCALE).as_posix(): catalog_stats(p) for p in sorted(LOCALE.rglob("*.po"))}


def fuzzy_headers(locale=LOCALE):
    """Catalogs whose header still carries '#, fuzzy' (msgfmt would drop the header)."""
    return [p.relative_to(locale).as_posix() for p in sorted(Path(locale).rglob("*.po")) if read_catalog(p).fuzzy]


def main():
    stats = all_stats()
    print(f"{'catalog':<56} {'translated':>10} {'untranslated':>12} {'fuzzy':>6}")
    for name, (done, missing, fuzzy) in stats.items():
        print(f"{name:<56} {done:>10} {missing:>12} {fuzzy:>6}")
    totals = [sum(column) for column in zip(*stats.values())] or [0, 0, 0]
    print(f"{'total':<56} {totals[0]:>10} {totals[1]:>12} {totals[2]:>6}")
    headers = fuzzy_headers()
    for name in headers:
        print(f"{name}: the header is marked fuzzy; delete the '#, fuzzy' line above msgid \"\"")
    return 1 if totals[1] or totals[2] or headers else 0


if __name__ == "__main__":
    sys.exit(main())
