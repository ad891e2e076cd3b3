"""docs/protocol.md carries the public contract (Part I) as the shared page has it: a
clone has only docs/, so what the README and the code cite must be there, and stay the
same text as the shared PROTOCOL.md."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "protocol.md"
BEGIN, END = "<!-- contract: begin -->\n", "\n<!-- contract: end -->"


def contract_part() -> str:
    text = DOC.read_text(encoding="utf-8")
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    return text.split(BEGIN, 1)[1].split(END, 1)[0]


def shared_page() -> Path | None:
    """The shared page, found beside the checkout (or its worktree's main checkout)."""
    for parent in ROOT.parents:
        candidate = parent / "shared" / "PROTOCOL.md"
        if candidate.is_file():
            return candidate
    return None


def test_the_contract_part_has_every_section_of_the_protocol() -> None:
    contract = contract_part()
    assert contract.startswith("# Herald wire protocol")
    for number in range(1, 10):
        assert f"\n## {number}. " in contract, f"§{number} missing"


def test_the_contract_part_is_the_shared_page_word_for_word() -> None:
    page = shared_page()
    if page is None:
        pytest.skip("no shared PROTOCOL.md beside this checkout")
    assert contract_part() == page.read_text(encoding="utf-8").rstrip("\n"), (
        "docs/protocol.md Part I differs from the shared PROTOCOL.md: copy it again"
    )


def test_no_doc_links_outside_the_repository() -> None:
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        assert "../shared/PROTOCOL.md)" not in path.read_text(encoding="utf-8"), path
