"""``python -m model_check``: placeholder until the explorer lands (issue 3)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    print(
        "model_check: the explorer is not built yet; it will check the protocol in "
        f"spec/ with arguments {args}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
