"""Serving the built site on loopback, under a path prefix, and driving Debian's Chromium."""

import functools
import http.server
import shutil
import sys
import threading
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
PREFIX = "/course/"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


def chromium_available():
    return Path(CHROMIUM).exists() or shutil.which("chromium") is not None


class PrefixedSiteHandler(http.server.SimpleHTTPRequestHandler):
    """Serves ``site_root`` under ``PREFIX``, and ``404.html`` for what is missing, as a static host does."""

    def __init__(self, *args, site_root, **kwargs):
        self.site_root = Path(site_root)
        super().__init__(*args, directory=str(site_root), **kwargs)

    def translate_path(self, path):
        path = path.split("?", 1)[0].split("#", 1)[0]
        if not path.startswith(PREFIX):
            return str(self.site_root / "__outside_prefix__")
        return super().translate_path("/" + path[len(PREFIX):])

    def send_error(self, code, message=None, explain=None):
        page = self.site_root / "404.html"
        if code != 404 or not page.exists():
            return super().send_error(code, message, explain)
        body = page.read_bytes()
        self.send_response(404)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class QuietServer(http.server.ThreadingHTTPServer):
    """A client that hangs up early (a crawler that has seen enough) is no error of the site."""

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def serve(site_root):
    """Start a loopback server; returns (server, base URL ending in PREFIX)."""
    handler = functools.partial(PrefixedSiteHandler, site_root=site_root)
    server = QuietServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}{PREFIX}"
