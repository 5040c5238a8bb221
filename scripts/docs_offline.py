"""mkdocs hook: no address of a content delivery network is left in the built site.

The theme's bundle names two scripts on unpkg.com that it loads only as fallbacks: mermaid when no
mermaid is on the page (the site loads its vendored copy on every page, `extra_javascript`) and a
ResizeObserver polyfill for browsers without one (every browser the theme supports has it). The
site must open with no network, and a reader must be able to check that it will (no CDN address
anywhere in it), so after the build those fallback addresses are emptied: a fallback that is
never taken loads nothing either way.
"""

from __future__ import annotations

import re
from pathlib import Path

CDN = re.compile(r"https?://(?:unpkg\.com|cdn\.jsdelivr\.net|cdnjs\.cloudflare\.com)/[^\"'`\s\\]*")


def on_post_build(config, **kwargs) -> None:
    for path in Path(config["site_dir"], "assets", "javascripts").rglob("*"):
        if path.suffix in (".js", ".map"):
            text = path.read_text(encoding="utf-8")
            emptied = CDN.sub("", text)
            if emptied != text:
                path.write_text(emptied, encoding="utf-8")
