"""No broken internal link or anchor in either edition, checked by LinkChecker over loopback."""

import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urljoin

LINKCHECKER = Path(sys.prefix, "bin", "linkchecker")
# External links are listed but never fetched: the check needs no network.
CONFIG = """
[checking]
threads=4
[filtering]
checkextern=0
[AnchorCheck]
"""


def test_no_broken_internal_links_or_anchors(served, tmp_path):
    _, base = served
    assert LINKCHECKER.exists() or shutil.which("linkchecker")
    config = tmp_path / "linkcheckerrc"
    config.write_text(CONFIG)
    done = subprocess.run(
        [str(LINKCHECKER), "--config", str(config), "--no-status", "--output", "text",
         urljoin(base, "index.html"), urljoin(base, "en/index.html"), urljoin(base, "zh_CN/index.html")],
        capture_output=True, text=True, check=False, timeout=900,
    )
    report = done.stdout + done.stderr
    summary = re.search(r"(\d+) links? in (\d+) URLs? checked.*?(\d+) warnings? found.*?(\d+) errors? found",
                        report, re.DOTALL)
    assert summary, report[-3000:]
    print(summary.group(0))
    assert int(summary.group(2)) > 50, "LinkChecker did not crawl the site"
    assert int(summary.group(4)) == 0, report[-6000:]
