"""Pages that paint once and do not move: gallery thumbnails with their size, loaded lazily.

A thumbnail without ``width`` and ``height`` takes no room until its image has
arrived, so the gallery grid below it shifts as each one loads; with its real
size the browser reserves the room at first paint. ``loading="lazy"`` leaves
thumbnails below the fold for later.
"""

import struct
from pathlib import Path

from docutils import nodes


def png_size(path):
    """(width, height) from a PNG's header, or None if ``path`` is not a PNG."""
    with open(path, "rb") as f:
        head = f.read(24)
    if len(head) < 24 or head[:8] != b"\x89PNG\r\n\x1a\n":
        return None
    return struct.unpack(">II", head[16:24])


def size_the_thumbnails(app, doctree):
    for image in doctree.findall(nodes.image):
        uri = image.get("uri", "")
        if "/images/thumb/" not in uri:
            continue
        path = Path(app.srcdir, uri.lstrip("/"))
        size = png_size(path) if path.is_file() else None
        if size:
            image["width"], image["height"] = (str(v) for v in size)
        image["loading"] = "lazy"
        # A sized image would otherwise be wrapped in a link to its full-size file.
        image["classes"].append("no-scaled-link")


def setup(app):
    app.connect("doctree-read", size_the_thumbnails)
    return {"parallel_read_safe": True, "version": "1"}
