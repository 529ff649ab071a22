"""python -m docsgen [--check]: rewrite the generated parts of docs/ and README.md (or, with --check, list the stale
ones and exit 1)."""
import sys

from docsgen import blocks


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--check"]:
        stale = blocks.stale()
        for page, part in stale:
            print(f"{page}: generated part '{part}' is stale; run python -m docsgen")
        return 1 if stale else 0
    if argv:
        print("usage: python -m docsgen [--check]", file=sys.stderr)
        return 2
    for page in blocks.rewrite():
        print(f"rewrote {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
