"""docs/grafana-dashboard.json queries only families a real server's /metrics has."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json"


def test_dashboard_queries_only_families_the_server_exposes(herald_url: str) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [v["query"]["query"] for v in dashboard["templating"]["list"]]
    used = {
        re.sub(r"_(bucket|sum|count)$", "", m) for e in exprs for m in re.findall(r"herald_\w+", e)
    }
    text = httpx.get(f"{herald_url}/metrics").text
    exposed = set(re.findall(r"^# TYPE (herald_\w+) ", text, re.MULTILINE))
    assert used and used <= exposed, used - exposed
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
