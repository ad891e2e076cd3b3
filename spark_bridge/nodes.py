"""Which Herald nodes the bridge talks to: option `urls`, else `url`, comma-separated."""

from __future__ import annotations

from herald._http import DEFAULT_URL


def node_urls(options: dict[str, str]) -> tuple[str, ...]:
    """The Herald nodes to talk to: option `urls`, else `url`, each comma-separated
    (PROTOCOL §7: any node of a cluster serves the bridge; the next one when it dies)."""
    raw = options.get("urls") or options.get("url") or DEFAULT_URL
    urls = tuple(u.strip().rstrip("/") for u in raw.split(",") if u.strip())
    if not urls:
        raise ValueError("the herald data source needs option 'url' (or 'urls')")
    return urls
