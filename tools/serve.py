"""Serve both editions on loopback and rebuild them when a source changes (``make serve``).

The build has a tree of its own, ``<out>/{en,zh_CN}`` with ``<out>/doctrees``,
apart from ``make html``'s, so that neither makes the other read every page
again. A new tree starts as a copy of ``make html``'s where there is one
(``--seed``), so the first build reads only what changed since. Examples
execute as in ``make html`` and share its generated gallery: an example edited
while serving executes once, and ``make html`` then finds it current. A browser
shows a rebuild when the page is reloaded.

    python tools/serve.py --out _build/serve --seed _build --tree _build/tree-zh_CN --port 8000
"""

import argparse
import functools
import http.server
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EDITIONS = ("en", "zh_CN")
# What a rebuild reads; the generated gallery (source/auto_examples) is written by the build itself.
WATCHED = ("conf.py", "source", "examples", "sphinxext", "locale", "_static", "_templates", "site-root")
BUILD_OUTPUTS = {"auto_examples", "__pycache__"}
POLL_SECONDS = 1.0


def build(out, tree):
    """Both editions into ``out``, each executing its own programs (the Chinese ones in
    ``tree``, as ``make html`` writes them); False on failure."""
    write = [sys.executable, "tools/program_messages.py", "write", str(tree)]
    if subprocess.run(write, cwd=REPO, check=False).returncode:
        print("The Chinese programs could not be written (see above); still serving the last good build.")
        return False
    for language in EDITIONS:
        print(f"== {language} edition", flush=True)
        source = "source" if language == "en" else str(tree / "source")
        command = [sys.executable, "-m", "sphinx", "build", "-c", ".", "-W", "--keep-going",
                   "-b", "html", "-D", f"language={language}", "-d", str(out / "doctrees" / language),
                   source, str(out / language)]
        if subprocess.run(command, cwd=REPO, check=False).returncode != 0:
            print(f"The {language} edition failed to build (see above); still serving the last good build.")
            return False
    for page in (REPO / "site-root").iterdir():
        shutil.copy2(page, out / page.name)
    shutil.copy2(out / "en" / "404.html", out / "404.html")
    return True


def seed(out, html_build):
    """Start a new tree from ``make html``'s pages and doctrees in ``html_build``, where there are any."""
    for language in EDITIONS:
        pages, doctrees = html_build / "html" / language, html_build / "doctrees" / language
        if not (out / language).exists() and pages.is_dir() and doctrees.is_dir():
            shutil.copytree(pages, out / language)
            shutil.copytree(doctrees, out / "doctrees" / language)


def snapshot():
    """Modification times of every file a rebuild reads."""
    times = {}
    for name in WATCHED:
        path = REPO / name
        files = [path] if path.is_file() else path.rglob("*")
        for file in files:
            if file.is_file() and not BUILD_OUTPUTS & set(file.parts) and file.suffix != ".mo":
                times[file] = file.stat().st_mtime_ns
    return times


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def serve(out, port):
    handler = functools.partial(QuietHandler, directory=str(out))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("_build/serve"))
    parser.add_argument("--seed", type=Path, help="make html's build folder, to start a new tree from")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--tree", type=Path, default=Path("_build/tree-zh_CN"),
                        help="the Chinese edition's tree, shared with make html")
    args = parser.parse_args()
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl+C stops it, even if started in the background
    out = (REPO / args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.seed:
        seed(out, (REPO / args.seed).resolve())

    server = serve(out, args.port)
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        seen = snapshot()
        tree = (REPO / args.tree).resolve()
        build(out, tree)
        print(f"Serving {url}: English at {url}en/, Chinese at {url}zh_CN/."
              " Rebuilt when a file changes; press Ctrl+C to stop.", flush=True)
        while True:
            time.sleep(POLL_SECONDS)
            now = snapshot()
            if now != seen:
                changed = sorted(str(p.relative_to(REPO)) for p in now.keys() ^ seen.keys()
                                 | {p for p in now.keys() & seen.keys() if now[p] != seen[p]})
                print(f"Changed: {', '.join(changed[:5])}{' ...' if len(changed) > 5 else ''}", flush=True)
                seen = now
                if build(out, tree):
                    print(f"Rebuilt; reload the page. Serving {url}", flush=True)
    except KeyboardInterrupt:
        print("\nStopped serving.")
    finally:
        server.shutdown()


if __name__ == "__main__":
    main()
