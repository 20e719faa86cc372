"""python -m specswap.zoo train tiny [--out DIR] [--target-steps N] [--distill-steps N]
python -m specswap.zoo measure [--dir DIR]"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from . import WEIGHTS_DIR


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m specswap.zoo", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="train a zoo family from offline text")
    train.add_argument("family", choices=["tiny"])
    train.add_argument("--out", type=Path, default=WEIGHTS_DIR, help=f"output root (default {WEIGHTS_DIR})")
    train.add_argument("--target-steps", type=int)
    train.add_argument("--distill-steps", type=int)
    train.add_argument("--seed", type=int)
    train.add_argument("--no-measure", action="store_true", help="skip the acceptance measurement")
    measure = commands.add_parser("measure", help="measure draft acceptance of tiny-eagle and tiny-draft")
    measure.add_argument("--dir", type=Path, default=WEIGHTS_DIR)
    args = parser.parse_args(argv)

    if args.command == "train":
        from .train import TinyRecipe, train_tiny
        overrides = {name: value for name, value in (("target_steps", args.target_steps),
                                                     ("distill_steps", args.distill_steps), ("seed", args.seed))
                     if value is not None}
        summary = train_tiny(args.out, dataclasses.replace(TinyRecipe(), **overrides), measure=not args.no_measure)
    else:
        import torch
        from .acceptance import measure_acceptance
        torch.set_num_threads(1)  # see TinyRecipe.threads
        summary = measure_acceptance(args.dir / "tiny", args.dir / "tiny-eagle", args.dir / "tiny-draft")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
