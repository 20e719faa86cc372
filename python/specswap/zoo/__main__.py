"""python -m specswap.zoo train tiny [--out DIR] [--target-steps N] [--distill-steps N]
python -m specswap.zoo train eagle --target {gemma-3-270m,smollm2-135m} [--minutes M] [--work DIR] [--out DIR]
    [--planned-steps N]   (train gemma-3-270m-eagle = train eagle --target gemma-3-270m)
python -m specswap.zoo train eagle3 --target {gemma-3-270m,smollm2-135m,tiny} [--minutes M] [--work DIR] [--out DIR]
    [--planned-steps N]   (an EAGLE-3 head: specswap.zoo.eagle3_training)
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
    train.add_argument("family", choices=["tiny", "eagle", "eagle3", "gemma-3-270m-eagle"])
    train.add_argument("--target", help="eagle: the registry target to train a head for (default gemma-3-270m)")
    train.add_argument("--out", type=Path, help=f"output root for tiny (default {WEIGHTS_DIR}); the head's directory "
                                                "for gemma-3-270m-eagle (default: the shipped one)")
    train.add_argument("--target-steps", type=int)
    train.add_argument("--distill-steps", type=int)
    train.add_argument("--seed", type=int)
    train.add_argument("--no-measure", action="store_true", help="skip the acceptance measurement")
    train.add_argument("--minutes", type=float, default=100.0, help="eagle: wall-clock budget")
    train.add_argument("--work", type=Path, help="eagle: resumable work directory "
                                                 "(default ~/.cache/specswap/<target>-eagle-run)")
    train.add_argument("--planned-steps", type=int, help="eagle: lr schedule length")
    measure = commands.add_parser("measure", help="measure draft acceptance of tiny-eagle and tiny-draft")
    measure.add_argument("--dir", type=Path, default=WEIGHTS_DIR)
    args = parser.parse_args(argv)

    if args.command == "train" and args.family == "eagle3":
        from . import eagle3_training
        target = args.target or eagle3_training.DEFAULT_TARGET
        if target not in eagle3_training.TARGETS:
            parser.error(f"--target {target!r}: supported targets are {', '.join(eagle3_training.TARGETS)}")
        options = [part for flag, value in (("--work", args.work), ("--out", args.out),
                                            ("--planned-steps", args.planned_steps)) if value is not None
                   for part in (flag, str(value))]
        eagle3_training.main(["--target", target, "--minutes", str(args.minutes), *options])
        return
    if args.command == "train" and args.family in ("eagle", "gemma-3-270m-eagle"):
        from . import eagle_training
        target = args.target or eagle_training.DEFAULT_TARGET
        if args.family == "gemma-3-270m-eagle" and target != "gemma-3-270m":
            parser.error(f"train gemma-3-270m-eagle trains for gemma-3-270m, not --target {target}; use train eagle")
        if target not in eagle_training.TARGETS:
            parser.error(f"--target {target!r}: supported targets are {', '.join(eagle_training.TARGETS)}")
        location = ["--target", target, *(part for flag, value in (("--work", args.work), ("--out", args.out))
                                          if value is not None for part in (flag, str(value)))]
        planned = ["--planned-steps", str(args.planned_steps)] if args.planned_steps else []
        eagle_training.main(["--minutes", str(args.minutes), *location, *planned])
        if not args.no_measure:
            eagle_training.main(["--measure", *location])
        return
    if getattr(args, "target", None) is not None:
        parser.error("--target is for train eagle")
    if args.command == "train":
        from .train import TinyRecipe, train_tiny
        overrides = {name: value for name, value in (("target_steps", args.target_steps),
                                                     ("distill_steps", args.distill_steps), ("seed", args.seed))
                     if value is not None}
        summary = train_tiny(args.out or WEIGHTS_DIR, dataclasses.replace(TinyRecipe(), **overrides),
                             measure=not args.no_measure)
    else:
        import torch
        from .acceptance import measure_acceptance
        torch.set_num_threads(1)  # see TinyRecipe.threads
        summary = measure_acceptance(args.dir / "tiny", args.dir / "tiny-eagle", args.dir / "tiny-draft")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
