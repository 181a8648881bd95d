"""Fuzz tests of model files: seeded mutations of tiny GGUF files and safetensors directories,
and consistent tiny models of random sizes, each loaded in a child process under a memory and a
time limit. Every case must end in a clean refusal (``ModelFileError``, another ``ValueError``,
``MemoryError``) or a correct load (finite logits that agree with a numpy reference, a short
generation, a tokenizer round trip), never in a crash, a hang, another exception or NaN logits.
Longer runs, and mutations of the bundled SmolLM2:
``python scripts/fuzz_models.py --cases 2000 --seed 7 --bases all``."""

from __future__ import annotations

import importlib.util
import os
import random
import shutil

import pytest

from .mutations import Mutation, mutations
from .runner import Case, Report, Runner, mutation_cases
from .tiny_files import build_bases

# (what it checks does not depend on the device: CI's second pass, on PoCL, leaves it out)
pytestmark = pytest.mark.host

SEED = 20261123
# Seconds measured on two cores with PoCL, with the kernel cache of an earlier run (an empty
# cache adds about 60 s in all: the whole folder took 86 s)
GGUF_CASES = 1000  # 5 s
SAFETENSORS_CASES = 500  # 2 s, and 4 to 8 s to build the bases with transformers
# (each shape builds its kernels: 60 cases took 34 s on Intel's runtime, 121 s on PoCL)
SHAPES_CASES = 30
HAVE_TORCH = all(importlib.util.find_spec(m) for m in ("torch", "transformers"))


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> dict[str, str]:
    return build_bases(str(tmp_path_factory.mktemp("bases")), safetensors=HAVE_TORCH)


def _check(report: Report, cases: int, least_loaded: float, least_rejected: float) -> None:
    print(report.summary())
    assert not report.failures, report.summary()
    n = len(report.outcomes)
    assert n == cases, report.summary()
    loaded = sum(o.outcome == "loaded" for o in report.outcomes)
    rejected = sum(o.outcome == "rejected" for o in report.outcomes)
    # the mix must exercise both paths: files that load, files that are refused
    assert loaded >= least_loaded * n and rejected >= least_rejected * n, report.summary()


def test_harness_notices_crashes_hangs_and_the_memory_limit():
    """The runner records a killed child as a crash or a hang and goes on from the next case
    in a new child; the child's address space is limited."""
    probes = ["ok", "abort", "ok", "segv", "ok", "hang", "ok", "alloc"]
    cases = [Case(i, f"{i} {p}", probe=p) for i, p in enumerate(probes)]
    report = Runner(workers=1, case_timeout=3, memory_mb=3072).run(cases)
    got = [(o.outcome, o.type) for o in report.outcomes]
    assert got == [("loaded", ""), ("crash", ""), ("loaded", ""), ("crash", ""), ("loaded", ""),
                   ("hang", ""), ("loaded", ""), ("rejected", "MemoryError")], report.summary()
    assert "SIGABRT" in report.outcomes[1].detail and "SIGSEGV" in report.outcomes[3].detail
    assert "Segmentation fault" in report.outcomes[3].detail  # the child's stderr
    assert [o.case.id for o in report.failures] == [1, 3, 5]


def test_unmutated_bases_load_and_match_the_reference(bases):
    def copier(path: str):
        def write(folder: str) -> str:
            dst = os.path.join(folder, os.path.basename(path))
            if os.path.isdir(path):
                shutil.copytree(path, dst)
            else:
                shutil.copy(path, dst)
            return dst
        return write

    cases = [Case(i, name, mutation=Mutation(name, "unchanged", copier(path)))
             for i, (name, path) in enumerate(bases.items())]
    report = Runner(workers=1).run(cases)
    assert [o.outcome for o in report.outcomes] == ["loaded"] * len(bases), report.summary()


def test_gguf_mutations_fail_cleanly(bases):
    streams = {name: mutations(name, path, random.Random(f"{SEED}-{name}"))
               for name, path in bases.items() if name.startswith("gguf-")}
    report = Runner(workers=2).run(mutation_cases(streams, GGUF_CASES))
    _check(report, GGUF_CASES, least_loaded=0.1, least_rejected=0.5)


@pytest.mark.skipif(not HAVE_TORCH, reason="the safetensors bases are made with transformers")
def test_safetensors_mutations_fail_cleanly(bases):
    streams = {name: mutations(name, path, random.Random(f"{SEED}-{name}"))
               for name, path in bases.items() if name.startswith("hf-")}
    report = Runner(workers=2).run(mutation_cases(streams, SAFETENSORS_CASES))
    _check(report, SAFETENSORS_CASES, least_loaded=0.1, least_rejected=0.5)


def test_consistent_models_of_random_sizes_load_or_fail_cleanly():
    """Files that agree with themselves but have unusual sizes and weight types (one or three
    layers, a KV head per head or one for all, heads of 8 to 256, tied or not, biases)."""
    streams = {"shapes": mutations("shapes", "shapes", random.Random(SEED))}
    report = Runner(workers=2).run(mutation_cases(streams, SHAPES_CASES))
    _check(report, SHAPES_CASES, least_loaded=0.7, least_rejected=0.0)
