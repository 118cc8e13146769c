"""Print the configuration table of docs/configuration.md, generated from spark_statebackend.settings.KEYS.

    python tools/config_table.py

It replaces the table under docs/configuration.md's "## Every key" (from its `| key |` header row to its
last row); tests/settings/test_config_table.py fails while that table differs from it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout's package, not an install

from spark_statebackend.settings import markdown_table

#: A Markdown link's target that is a relative path (no scheme such as https:, no bare #fragment).
_RELATIVE_TARGET = re.compile(r"\]\((?![A-Za-z][A-Za-z0-9+.-]*:|#)([^)\s]+)\)")


def links_from_docs(markdown: str) -> str:
    """`markdown` with its relative links, written from the repository's root (as settings.KEYS writes
    them, for the README), rewritten to work from docs/: `docs/x.md` becomes `x.md`, any other path
    `../path`. Text that is not a link target is unchanged."""

    def relink(m: re.Match[str]) -> str:
        target = m.group(1)
        return "](" + (target.removeprefix("docs/") if target.startswith("docs/") else "../" + target) + ")"

    return _RELATIVE_TARGET.sub(relink, markdown)


def docs_table() -> str:
    """The table docs/configuration.md holds: a row per settings.KEYS entry, in its order, with its links
    relative to docs/."""
    return links_from_docs(markdown_table())


if __name__ == "__main__":
    sys.stdout.write(docs_table())
