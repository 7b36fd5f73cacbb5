"""docs/README.md, the docs index, links every page of docs/ and only pages that exist."""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_the_index_links_every_doc_and_nothing_missing() -> None:
    index = (DOCS / "README.md").read_text()
    linked = set(re.findall(r"\]\(([^)#\s]+\.md)\)", index))
    pages = {p.name for p in DOCS.glob("*.md")} - {"README.md"}
    assert pages - linked == set(), "pages missing from docs/README.md"
    assert [link for link in sorted(linked) if not (DOCS / link).resolve().is_file()] == []
