"""The hpcgpu page: ``/hpcgpu`` and ``/hpcgpu/data.json`` on the scheduler's dashboard port.

The page is three files shipped with the package (``static/index.html``,
``hpcgpu.css``, ``hpcgpu.js``; no external scripts or fonts) and needs no
Bokeh. Its script polls ``data.json`` beside it every second: the same data
as JSON, for scripts too (strict JSON, ``null`` where a value is missing).
The routes match under any dashboard prefix (``dask scheduler
--dashboard-prefix``) and behind a proxy: every link is relative.
"""

import json
import logging
from pathlib import Path

from tornado import web

__all__ = ["STATIC", "add_routes"]

logger = logging.getLogger(__name__)

STATIC = Path(__file__).resolve().with_name("static")
# Matches the page under any dashboard prefix.
_ROUTE = r"(?:/.*)?/hpcgpu"


def add_routes(scheduler, plugin):
    """Serve the page and ``data.json`` (``plugin.snapshot()``) from ``scheduler``'s dashboard, if it has one."""
    app = getattr(scheduler, "http_application", None)
    if app is None:
        return
    app.add_handlers(r".*$", [
        (_ROUTE + r"/?", _PageHandler),
        (_ROUTE + r"/data\.json", _DataHandler, {"plugin": plugin}),
        (_ROUTE + r"/(hpcgpu\.(?:css|js))", _AssetHandler, {"path": str(STATIC)}),
    ])


class _PageHandler(web.RequestHandler):
    def get(self):
        if not self.request.path.endswith("/"):
            # Relative, so it also holds behind a proxy (jupyter-server-proxy) that adds a prefix:
            # the page's own links (hpcgpu.css, data.json) are relative to ".../hpcgpu/".
            self.redirect("hpcgpu/", permanent=False)
            return
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.write((STATIC / "index.html").read_bytes())


class _AssetHandler(web.StaticFileHandler):
    def set_extra_headers(self, path):
        self.set_header("Cache-Control", "no-cache")  # revalidate: an upgraded hpcgpu serves new files


class _DataHandler(web.RequestHandler):
    def initialize(self, plugin):
        self.plugin = plugin

    def get(self):
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        try:
            body = json.dumps(self.plugin.snapshot(), allow_nan=False, default=str)
        except Exception as error:  # noqa: BLE001 - the page shows the error instead of a blank
            logger.warning("hpcgpu dashboard: data.json failed (%s: %s)", type(error).__name__, error)
            body = json.dumps({"error": f"{type(error).__name__}: {error}", "runs": [], "workers": [],
                               "gpus": {"available": False, "reason": "error", "devices": []}})
        self.write(body)
