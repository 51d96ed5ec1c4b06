"""Make GE Data Docs open offline: point CDN CSS/JS at vendored copies, drop what only decorates.

GE's pages load Bootstrap, jQuery, bootstrap-table, Font Awesome and Vega from CDNs. The ones the validation and
index pages need to render are vendored in `datadocs_assets/` (MIT, see LICENSES.txt) and copied into the site;
icon fonts, the dark theme, the date picker, the remote logo and Vega (only profiling charts use it) are
removed. Plain links (`<a href>`) to the GE docs stay: they load nothing.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

ASSETS = Path(__file__).with_name("datadocs_assets")
VENDOR_DIR = "static/trainyard-vendor"

# a CDN URL ending -> the vendored file that replaces it
VENDORED = {
    "bootstrap/4.3.1/css/bootstrap.min.css": "bootstrap.min.css",
    "bootstrap/4.3.1/js/bootstrap.min.js": "bootstrap.min.js",
    "jquery-3.7.1.min.js": "jquery.min.js",
    "popper.js/1.12.9/umd/popper.min.js": "popper.min.js",
    "bootstrap-table@1.19.1/dist/bootstrap-table.min.css": "bootstrap-table.min.css",
    "bootstrap-table@1.19.1/dist/bootstrap-table.min.js": "bootstrap-table.min.js",
    "filter-control/bootstrap-table-filter-control.min.js": "bootstrap-table-filter-control.min.js",
    "filter-control/bootstrap-table-filter-control.min.css": "bootstrap-table-filter-control.min.css",
    "filter-control/bootstrap-table-filter-control.css": "bootstrap-table-filter-control.min.css",
}
REMOTE_LINK = re.compile(r"<link\b[^>]*\bhref=\"(https?://[^\"]+)\"[^>]*>", re.I)
REMOTE_IMAGE = re.compile(r"<img\b[^>]*\bsrc=\"https?://[^\"]+\"[^>]*>", re.I)
REMOTE_SCRIPT = re.compile(r"<script\b[^>]*\bsrc=\"(https?://[^\"]+)\"[^>]*>\s*</script>", re.I)


def _local(url: str) -> str | None:
    for suffix, name in VENDORED.items():
        if url.endswith(suffix):
            return name
    return None


def rewrite_page(html: str, vendor_prefix: str) -> str:
    """Replace vendored CDN tags with local ones; remove every other remote stylesheet, script or image."""

    def link(match: re.Match[str]) -> str:
        name = _local(match.group(1))
        return f'<link rel="stylesheet" href="{vendor_prefix}/{name}">' if name else ""

    def script(match: re.Match[str]) -> str:
        name = _local(match.group(1))
        return f'<script src="{vendor_prefix}/{name}"></script>' if name else ""

    html = REMOTE_SCRIPT.sub(script, REMOTE_LINK.sub(link, html))
    return REMOTE_IMAGE.sub("<strong>Great Expectations</strong>", html)


def make_offline(site: Path) -> int:
    """Rewrite every page of the Data Docs `site`; returns how many pages were changed."""
    if not site.is_dir():
        return 0
    vendor = site / VENDOR_DIR
    vendor.mkdir(parents=True, exist_ok=True)
    for asset in ASSETS.iterdir():
        shutil.copyfile(asset, vendor / asset.name)
    changed = 0
    for page in site.rglob("*.html"):
        prefix = os.path.relpath(vendor, page.parent).replace(os.sep, "/")
        original = page.read_text(encoding="utf-8")
        updated = rewrite_page(original, prefix)
        if updated != original:
            page.write_text(updated, encoding="utf-8")
            changed += 1
    return changed
