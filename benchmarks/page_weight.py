"""Bytes each built page costs a reader: its HTML, its images, and the scripts and styles it loads.

    .venv/bin/python benchmarks/page_weight.py [_build/html]

Target: every gallery page under 1.5 MB in all.
"""

import sys
from pathlib import Path
from urllib.parse import urlsplit

from bs4 import BeautifulSoup

TARGET_BYTES = 1.5e6


def local_file(page, reference):
    path = urlsplit(reference).path
    if not path or urlsplit(reference).scheme:
        return None
    target = (page.parent / path).resolve()
    return target if target.is_file() else None


def weigh(page):
    html = BeautifulSoup(page.read_text(encoding="utf-8"), "html.parser")
    images = {local_file(page, img.get("src", "")) for img in html.find_all("img")} - {None}
    assets = {local_file(page, tag.get("src") or tag.get("href") or "")
              for tag in html.find_all(["script", "link"])
              if tag.name == "script" or "stylesheet" in (tag.get("rel") or [])} - {None}
    return (page.stat().st_size, sum(p.stat().st_size for p in images),
            sum(p.stat().st_size for p in assets))


def main():
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "_build/html")
    pages = sorted(p for p in root.glob("*/**/*.html") if "_static" not in p.parts)
    rows = [(p.relative_to(root).as_posix(), *weigh(p)) for p in pages]
    print(f"{'page':<64} {'html kB':>8} {'images kB':>10} {'js+css kB':>10} {'total kB':>9}")
    for name, html, images, assets in sorted(rows, key=lambda r: -sum(r[1:])):
        total = html + images + assets
        flag = "  over target" if "auto_examples" in name and total > TARGET_BYTES else ""
        print(f"{name:<64} {html / 1e3:8.0f} {images / 1e3:10.0f} {assets / 1e3:10.0f} "
              f"{total / 1e3:9.0f}{flag}")
    heaviest = max(rows, key=lambda r: sum(r[1:]))
    print(f"\n{len(rows)} pages; heaviest: {heaviest[0]} at {sum(heaviest[1:]) / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
