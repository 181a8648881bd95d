"""Fuzz tests, the parent side: runs cases (mutated model files, or probes) in child processes
(``tests.fuzz.worker``), many cases per child, each child under a memory limit and each case
under a time limit. A child that dies takes only its case with it: that case is recorded as a
crash (with the signal and the end of the child's stderr) or a hang, and a new child goes on
from the next case."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .mutations import Mutation
from .worker import MARK

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# outcomes that are defects; "rejected" (a clean error) and "loaded" are not
FAILURES = ("error", "nonfinite", "mismatch", "crash", "hang")


@dataclass
class Case:
    id: int
    what: str
    mutation: Mutation | None = None
    probe: str | None = None
    reference: bool = True  # compare a loaded model with the numpy reference


@dataclass
class Outcome:
    case: Case
    outcome: str
    type: str = ""
    detail: str = ""
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return self.outcome in FAILURES

    def __str__(self) -> str:
        kind = f" {self.type}" if self.type else ""
        return f"case {self.case.id} [{self.case.what}]: {self.outcome}{kind}: {self.detail}"


@dataclass
class Report:
    outcomes: list[Outcome] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.failed]

    def counts(self) -> Counter[str]:
        return Counter(o.outcome + (f" {o.type}" if o.type and not o.failed else "")
                       for o in self.outcomes)

    def summary(self) -> str:
        counts = ", ".join(f"{k}: {v}" for k, v in sorted(self.counts().items()))
        lines = [f"{len(self.outcomes)} cases in {self.seconds:.1f} s ({counts})"]
        lines += [str(o) for o in self.failures]
        return "\n".join(lines)


class _Child:
    """One worker process and its stdout buffer."""

    def __init__(self, args: list[str], log_path: str, start_timeout: float) -> None:
        self.log_path = log_path
        self.log = open(log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.fuzz.worker", *args], cwd=REPO,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
            start_new_session=True)
        self.buf = b""
        self.ended = False
        ready = self.read(start_timeout)
        if ready is None or not ready.get("ready"):
            tail = self.stderr_tail()
            self.kill()
            raise RuntimeError(f"the fuzz worker did not start: {tail}")

    def send(self, req: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(req) + "\n").encode())
        self.proc.stdin.flush()

    def read(self, timeout: float) -> dict[str, Any] | None:
        """The next outcome line; None when the child ended (then ``ended`` is set) or the
        time ran out."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                text = line.decode("utf-8", "replace")
                if text.startswith(MARK):
                    return dict(json.loads(text[len(MARK):]))
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                self.ended = True
                return None
            self.buf += chunk

    def stderr_tail(self, n: int = 1500) -> str:
        self.log.flush()
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(max(0, os.path.getsize(self.log_path) - n))
                return fh.read().decode("utf-8", "replace").strip()
        except OSError:
            return ""

    def death(self) -> str:
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.proc.returncode
        if code is not None and code < 0:
            try:
                why = f"signal {signal.Signals(-code).name}"
            except ValueError:
                why = f"signal {-code}"
        else:
            why = f"exit status {code}"
        return f"the child died ({why}): {self.stderr_tail()[-800:]}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()
        self.log.close()


class Runner:
    """Runs cases over ``workers`` child processes at once.

    ``memory_mb``: each child's address-space limit; ``case_timeout``: seconds a case may
    take (the first case of a child also gets ``start_timeout`` for imports and kernel
    builds); ``keep``: a folder where the files of failed cases are written."""

    def __init__(self, memory_mb: int = 3072, case_timeout: float = 30.0,
                 start_timeout: float = 120.0, workers: int = 2, device: str | None = None,
                 keep: str | None = None) -> None:
        self.memory_mb, self.case_timeout = memory_mb, case_timeout
        self.start_timeout, self.workers = start_timeout, workers
        self.device, self.keep = device, keep

    def _args(self) -> list[str]:
        args = ["--memory-mb", str(self.memory_mb)]
        if self.device:
            args += ["--device", self.device]
        return args

    def run(self, cases: Iterable[Case], progress: bool = False) -> Report:
        report = Report()
        lock = threading.Lock()
        it: Iterator[Case] = iter(cases)
        t0 = time.perf_counter()

        def next_case() -> Case | None:
            with lock:
                return next(it, None)

        def record(o: Outcome) -> None:
            with lock:
                report.outcomes.append(o)
                if progress:
                    n = len(report.outcomes)
                    if o.failed:
                        print(f"  FAILED {o}", file=sys.stderr, flush=True)
                    if n % 50 == 0:
                        print(f"  {n} cases, {len(report.failures)} failed "
                              f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr,
                              flush=True)

        errors: list[BaseException] = []

        def work(slot: int) -> None:
            try:
                run_slot(slot)
            except BaseException as e:  # noqa: BLE001 - raised again after the join
                errors.append(e)

        def run_slot(slot: int) -> None:
            with tempfile.TemporaryDirectory(prefix=f"clops-fuzz-{slot}-") as tmp:
                child: _Child | None = None
                try:
                    while (case := next_case()) is not None:
                        if child is None:
                            child = _Child(self._args(), os.path.join(tmp, "stderr.log"),
                                           self.start_timeout)
                            timeout = self.start_timeout + self.case_timeout
                        else:
                            timeout = self.case_timeout
                        o, child = self._one(child, case, tmp, timeout)
                        if o.failed and self.keep and case.mutation is not None:
                            case.mutation.write(_fresh(os.path.join(self.keep,
                                                                    f"case-{case.id}")))
                        # NOTE: a mutation may hold a whole changed copy of its base (98 MB
                        # for SmolLM2): the outcome keeps only its description
                        case.mutation = None
                        record(o)
                finally:
                    if child is not None:
                        child.kill()

        threads = [threading.Thread(target=work, args=(i,)) for i in range(self.workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        report.outcomes.sort(key=lambda o: o.case.id)
        report.seconds = time.perf_counter() - t0
        return report

    def _one(self, child: _Child, case: Case, tmp: str, timeout: float
             ) -> tuple[Outcome, _Child | None]:
        req: dict[str, Any] = {"id": case.id, "reference": case.reference}
        if case.probe is not None:
            req["probe"] = case.probe
        else:
            assert case.mutation is not None
            req["path"] = case.mutation.write(_fresh(os.path.join(tmp, "case")))
        try:
            child.send(req)
        except BrokenPipeError:
            return Outcome(case, "crash", detail=child.death()), _dead(child)
        t0 = time.perf_counter()
        res = child.read(timeout)
        if res is None:
            if not child.ended:
                child.kill()
                return Outcome(case, "hang", detail=f"no answer in {timeout:.0f} s",
                               seconds=time.perf_counter() - t0), None
            return Outcome(case, "crash", detail=child.death(),
                           seconds=time.perf_counter() - t0), _dead(child)
        return Outcome(case, str(res["outcome"]), str(res.get("type", "")),
                       str(res.get("detail", "")), float(res.get("seconds", 0.0))), child


def _dead(child: _Child) -> None:
    child.kill()
    return None


def _fresh(folder: str) -> str:
    if os.path.isdir(folder):
        shutil.rmtree(folder)
    os.makedirs(folder)
    return folder


def mutation_cases(streams: dict[str, Iterator[Mutation]], count: int, first_id: int = 0,
                   reference: Iterable[str] | None = None) -> Iterator[Case]:
    """``count`` cases taken from the mutation streams in turn; those of the streams named in
    ``reference`` (default: all) are compared with the numpy reference when they load."""
    names = list(streams)
    ref = set(names if reference is None else reference)
    for i in range(count):
        name = names[i % len(names)]
        m = next(streams[name])
        yield Case(first_id + i, f"{m.base} {m.what}", mutation=m, reference=name in ref)
