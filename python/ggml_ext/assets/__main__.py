"""``python -m ggml_ext.assets ACTION ...``: the same as ``ggml-ext assets ACTION ...``."""
from __future__ import annotations

import argparse
import sys

from .cli import add_arguments, main

parser = argparse.ArgumentParser(prog="python -m ggml_ext.assets", description="The project's test assets.")
add_arguments(parser)
sys.exit(main(parser.parse_args()))
