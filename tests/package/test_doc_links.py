"""No dead links in the user's documentation (issue 22 item 6): every relative link in README.md and
docs/*.md names a file of the repository and, with a `#fragment`, a heading of that Markdown file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.paths import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", flags=re.M | re.S)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
#: [text](target) and ![alt](target), with an optional "title"; the text may hold `code` but no ].
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*([^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", flags=re.M)
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def _prose(text: str) -> str:
    """The text outside fenced code blocks and code spans, where a `[x](y)` is a link."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: its text as rendered (code, links and emphasis reduced to their
    text), lower case, without punctuation but `-` and `_`, spaces made `-`."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[`*]", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor GitHub gives the headings of `path` (a repeated one gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for heading in _HEADING.findall(_FENCE.sub("", path.read_text())):
        base = _anchor(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def dead_links(path: Path, root: Path = ROOT) -> list[str]:
    """The relative links of `path` that name no file under `root` or no heading of that file."""
    dead = []
    for target in _LINK.findall(_prose(path.read_text())):
        if _SCHEME.match(target):  # https:, mailto: ...: not this check's business
            continue
        file_part, _, fragment = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.is_relative_to(root) or not dest.exists():
            dead.append(f"{target} (no file {dest})")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            dead.append(f"{target} (no heading #{fragment} in {dest.relative_to(root)})")
    return dead


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc: Path) -> None:
    assert dead_links(doc) == [], f"{doc.relative_to(ROOT)} has dead links"


def test_the_check_finds_a_dead_file_a_dead_heading_and_a_way_out(tmp_path: Path) -> None:
    """The check itself can fail: each kind of dead link is reported, and only those."""
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "a.md").write_text("# A\n\n## Which one: `this` (2026)\n\n```\n# not a heading\n```\n")
    (root / "README.md").write_text(
        "# Title: one\n\n[ok](docs/a.md#which-one-this-2026) [self](#title-one) ![img](docs/a.md)\n"
        "[gone](docs/nothing.md) [no heading](docs/a.md#not-a-heading) `[code](x.md)`\n"
        "[out](../outside.md) [web](https://example.com/x.md)\n"
    )
    (tmp_path / "outside.md").touch()
    dead = [d.split(" ", 1)[0] for d in dead_links(root / "README.md", root=root)]
    assert dead == ["docs/nothing.md", "docs/a.md#not-a-heading", "../outside.md"]
