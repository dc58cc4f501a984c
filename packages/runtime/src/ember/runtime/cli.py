"""The `ember` command line: `ember demo`, `ember bench`, `ember explain`, `ember config`,
`ember cache`, `ember package`, `ember --version`.

Also runs as `python -m ember.runtime.cli` (for machines without the console script).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import ember.runtime  # noqa: F401  # registers the backend
from ember.runtime.config import config
from ember.runtime.environment import version_text


class _Version(argparse.Action):
    """`--version`: a line per package (argparse's own action would rewrap them)."""

    def __call__(self, parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        print(version_text())
        parser.exit()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="ember", description="Ember, a compiler backend for PyTorch."
    )
    parser.add_argument(
        "--version",
        action=_Version,
        nargs=0,
        help="print the version of each ember package, torch and Triton, and exit",
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
    explain = commands.add_parser(
        "explain",
        help="each compiled graph's kernels and ATen calls, the FX nodes each came from, "
        "bytes, and with EMBER_PROFILE=1 times and distance from the roof",
    )
    from ember.runtime.explain import add_arguments as add_explain_arguments

    add_explain_arguments(explain)
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
    if args.command == "explain":
        from ember.runtime.explain import run_cli as run_explain_cli

        return run_explain_cli(args)
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
