"""Command line: ``python -m tally FILE [--top N] [--format text|json|yaml]``."""

from __future__ import annotations

import argparse
import json
import sys

from tally import count_words, most_common


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tally",
                                     description="Print the most frequent words of a file.")
    parser.add_argument("path", help="UTF-8 text file")
    parser.add_argument("--top", type=int, default=10, help="how many words to print (default 10)")
    parser.add_argument("--format", choices=("text", "json", "yaml"), default="text")
    args = parser.parse_args(argv)
    with open(args.path, encoding="utf-8") as handle:
        pairs = most_common(count_words(handle.read()), args.top)
    if args.format == "json":
        json.dump(pairs, sys.stdout)
        sys.stdout.write("\n")
    elif args.format == "yaml":
        # YAML output lives in the optional tally-yaml plug-in distribution.
        from tally_yaml import dump_pairs

        sys.stdout.write(dump_pairs(pairs))
    else:
        for word, count in pairs:
            print(f"{count:6d} {word}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
