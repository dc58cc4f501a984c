"""The `ember` command line: `ember demo`, `ember bench`, `ember config`, `ember cache`.

Also runs as `python -m ember.runtime.cli` (for machines without the console script).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import ember.runtime  # noqa: F401  # registers the backend
from ember.runtime.config import config


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="ember", description="Ember, a compiler backend for PyTorch."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo", help="compile built-in models, compare with eager, print a table"
    )
    demo.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    demo.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads for eager and ember alike (torch.set_num_threads; default: torch's)",
    )
    bench = commands.add_parser(
        "bench", help="benchmark ember against eager and TorchInductor (benchmarks/README.md)"
    )
    from ember.runtime.bench import add_arguments, run_cli

    add_arguments(bench)
    commands.add_parser(
        "config",
        help="print ember's settings and the EMBER_* variables (exit status 1 if one is invalid)",
    )
    cache = commands.add_parser(
        "cache", help="the compile cache: `info` (directory, entries, size, cap) or `clear`"
    )
    from ember.runtime.cache import add_arguments as add_cache_arguments
    from ember.runtime.cache import run_cli as run_cache_cli

    add_cache_arguments(cache)
    package = commands.add_parser(
        "package", help="print an ahead-of-time package's manifest (ember.runtime.aot)"
    )
    package.add_argument("path", help="the package directory")
    package.add_argument("--json", action="store_true", help="print the manifest as JSON")
    args = parser.parse_args(argv)

    if args.command == "demo":
        from ember.runtime.demo import run_demo

        return run_demo(args.device, args.threads)
    if args.command == "bench":
        return run_cli(args)
    if args.command == "config":
        # bad values are listed, marked, not raised: this is where one looks for them
        print(config.describe())
        return 1 if config.errors() else 0
    if args.command == "cache":
        return run_cache_cli(args)
    if args.command == "package":
        from ember.runtime.aot import print_package

        return print_package(args.path, as_json=args.json)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
