"""The project's documents stand alone (issue 13): every file of the repository they name
exists, and none points outside the repository (a user has only the clone)."""

from __future__ import annotations

import re

import pytest

from tests.conftest import REPO

DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# A path into one of the repository's folders, as the documents write them.
PATH = re.compile(
    r"(?<![\w/.-])((?:cluster|bench|store|docs|tests|jepsen|native|proto|deploy|\.ci)/[\w./-]*[\w])"
)
LINK = re.compile(r"\]\(([^)#]+)")


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.name)
def test_every_repository_path_a_document_names_exists(document) -> None:  # type: ignore[no-untyped-def]
    missing = [
        path for path in PATH.findall(document.read_text())
        if not (REPO / path.rstrip(".")).exists()
    ]
    assert not missing, missing


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.name)
def test_no_document_points_outside_the_repository(document) -> None:  # type: ignore[no-untyped-def]
    text = document.read_text()
    assert "../shared" not in text
    for target in LINK.findall(text):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        resolved = (document.parent / target).resolve()
        assert resolved.is_relative_to(REPO), target
        assert resolved.exists(), target
