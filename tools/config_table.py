"""Print the README's configuration table, generated from spark_statebackend.settings.KEYS.

    python tools/config_table.py

It replaces the table under README.md's "## Configuration" (from its `| key |` header row to its last
row); tests/settings/test_config_table.py fails while the README's table differs from it.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout's package, not an install

from spark_statebackend.settings import markdown_table

if __name__ == "__main__":
    sys.stdout.write(markdown_table())
