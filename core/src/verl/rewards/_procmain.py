"""Entry point of a reward worker process: ``python -m verl.rewards._procmain <conn fd> <progress fd>``.

A module of its own because ``verl.rewards`` imports :mod:`verl.rewards._procworker`; running that
module with ``-m`` would execute it a second time next to the imported copy (runpy warns about it).
"""

from __future__ import annotations

import sys

from verl.rewards._procworker import main

if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2])))
