"""scripts, model-file fuzzing: the long run of tests/fuzz. Seeded mutations of tiny GGUF files,
tiny safetensors directories and (``--bases smollm2``) the bundled SmolLM2 GGUF, and consistent
tiny models of random sizes, each loaded in a child process under a memory and a time limit.
Prints what happened to every kind of mutation and each failure (a crash, a hang, another
exception than a clean refusal, NaN logits, logits off the numpy reference); exits 1 if there
was one.

    python scripts/fuzz_models.py --cases 2000 --seed 7
    python scripts/fuzz_models.py --cases 300 --bases smollm2 --keep /tmp/fuzz-failures
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
from collections import Counter

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from tests.fuzz.mutations import mutations  # noqa: E402
from tests.fuzz.runner import Report, Runner, mutation_cases  # noqa: E402
from tests.fuzz.tiny_files import build_bases  # noqa: E402

BASE_GROUPS = {"gguf": "gguf-", "safetensors": "hf-", "shapes": "shapes", "smollm2": "smollm2"}


def _bases(groups: set[str], root: str) -> dict[str, str]:
    bases: dict[str, str] = {}
    if groups & {"gguf", "safetensors"}:
        built = build_bases(root, safetensors="safetensors" in groups)
        bases.update({k: v for k, v in built.items()
                      if any(k.startswith(BASE_GROUPS[g]) for g in groups)})
    if "shapes" in groups:
        bases["shapes"] = "shapes"  # consistent models of random sizes, made for each case
    if "smollm2" in groups:
        import clops.llm

        bases["smollm2"] = clops.llm.default_model_path()
    return bases


def _by_kind(report: Report) -> str:
    """A table: mutation kind -> outcome counts."""
    table: dict[str, Counter[str]] = {}
    for o in report.outcomes:
        base, _, what = o.case.what.partition(" ")
        kind = what.split(":", 1)[0]
        table.setdefault(f"{base} {kind}", Counter())[o.outcome] += 1
    width = max((len(k) for k in table), default=10)
    return "\n".join(f"  {k:<{width}}  " + ", ".join(f"{n} {v}" for v, n in sorted(c.items()))
                     for k, c in sorted(table.items()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=1000, help="cases in all (default 1000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bases", default="gguf,safetensors,shapes",
                    help="comma-separated: gguf, safetensors, shapes, smollm2, or all")
    ap.add_argument("--workers", type=int, default=2, help="child processes at once")
    ap.add_argument("--memory-mb", type=int, default=4096, help="each child's address space")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds a case may take")
    ap.add_argument("--device", default=None, help="a clops device selector (default: default)")
    ap.add_argument("--keep", default=None, help="a folder for the files of failed cases")
    args = ap.parse_args()
    groups = set(BASE_GROUPS) if args.bases == "all" else set(args.bases.split(","))
    unknown = groups - set(BASE_GROUPS)
    if unknown:
        ap.error(f"unknown bases {sorted(unknown)}: choose from {sorted(BASE_GROUPS)} or all")
    with tempfile.TemporaryDirectory(prefix="clops-fuzz-bases-") as root:
        bases = _bases(groups, root)
        streams = {name: mutations(name, path, random.Random(f"{args.seed}-{name}"))
                   for name, path in bases.items()}
        # NOTE: the numpy reference of SmolLM2 would take gigabytes; its loads are checked
        # for finite logits, a generation and a tokenizer round trip only
        reference = [n for n in bases if n != "smollm2"]
        runner = Runner(memory_mb=args.memory_mb, case_timeout=args.timeout,
                        workers=args.workers, device=args.device, keep=args.keep)
        print(f"{args.cases} cases of {', '.join(bases)} (seed {args.seed})", flush=True)
        report = runner.run(mutation_cases(streams, args.cases, reference=reference),
                            progress=True)
    print(_by_kind(report))
    print(report.summary())
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
