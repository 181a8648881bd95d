"""Soak: ``clops serve`` under ``--streams`` concurrent streaming clients for ``--minutes``, a
fraction of them (``--leave``, a tenth by default) leaving at a random point of their request
(before the first token or after some). Every ``--every`` seconds it samples the server's
generated tokens (``/metrics``), resident memory (``/proc``), device memory (``nvidia-smi``
where there is one) and the engine's slots and cache blocks; it prints a line a sample and, at
the end, a verdict:

- throughput steady: after the first minute, the median tokens/s of the last third within 15%
  of the first third's;
- memory flat: resident and device memory at the end within 64 MiB (and 5%) of the sample
  after the first minute;
- no error other than the clients' own leaving; after the clients stop, the engine idle (no
  slot, no cache block taken) and ``/health`` ok.

    python bench/soak_serve.py [-m model.gguf] [--device gpu] [--streams 64] [--minutes 30]
                               [--json bench/results/soak_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_serve import _prompt, start_clops  # noqa: E402


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) << 10
    return 0


def _device_bytes(pid: int) -> int | None:
    """The process's memory on NVIDIA GPUs (nvidia-smi), or None where there is none."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    used = [int(m) for p, m in (ln.split(",") for ln in out.splitlines() if "," in ln)
            if int(p) == pid]
    return sum(used) << 20 if used else None


def _metrics(url: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(url + "/metrics", timeout=60).text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, value = line.split()
            out[name] = float(value)
    return out


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.done = self.left = 0
        self.errors: list[str] = []

    def add(self, what: str, error: str | None = None) -> None:
        with self.lock:
            if what == "done":
                self.done += 1
            elif what == "left":
                self.left += 1
            else:
                self.errors.append(error or what)


def client(url: str, i: int, stop: float, new: int, words: int, leave: float,
           temperature: float, tally: Tally) -> None:
    """One client's requests until ``stop``: each streamed to its end, or left early."""
    rng = random.Random(i)
    with httpx.Client(timeout=600) as c:
        n = 0
        while time.monotonic() < stop:
            n += 1
            body = {"prompt": _prompt(i * 1000 + n, words), "max_tokens": new,
                    "temperature": temperature, "seed": n, "stream": True, "ignore_eos": True}
            quit_after = rng.randrange(new) if rng.random() < leave else None
            got, ended = 0, False
            try:
                with c.stream("POST", url + "/v1/completions", json=body) as r:
                    if r.status_code != 200:
                        tally.add("error", f"HTTP {r.status_code}: {r.read()[:200]!r}")
                        continue
                    for line in r.iter_lines():
                        if quit_after is not None and got >= quit_after:
                            break
                        if line == "data: [DONE]":
                            ended = True
                        elif line.startswith("data: "):
                            d = json.loads(line[6:])
                            if "error" in d:
                                tally.add("error", str(d["error"])[:200])
                                break
                            got += sum(1 for ch in d.get("choices", []) if ch.get("text"))
            except httpx.HTTPError as e:
                tally.add("error", f"{type(e).__name__}: {e}")
                continue
            if quit_after is not None and not ended:
                tally.add("left")
            elif ended:
                tally.add("done")
            elif quit_after is None:
                tally.add("error", "the stream ended without [DONE]")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("-m", "--model", default=None, help="a GGUF file (default: SmolLM2)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--leave", type=float, default=0.1,
                    help="the fraction of requests whose client leaves early")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-words", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="0: greedy rows (the device chooses their tokens); above 0, rows "
                         "sampled on the host")
    ap.add_argument("--every", type=float, default=30.0, help="seconds between samples")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--json", default="bench/results/soak.json")
    a = ap.parse_args(argv)
    import clops.llm

    model = a.model or clops.llm.default_model_path()
    url, stop_server, dev, proc = start_clops(model, a.device, a.streams, a.ctx,
                                              with_process=True)
    samples: list[dict] = []
    tally = Tally()
    try:
        t0 = time.monotonic()
        stop = t0 + 60 * a.minutes
        with ThreadPoolExecutor(a.streams) as ex:
            futs = [ex.submit(client, url, i, stop, a.new_tokens, a.prompt_words, a.leave,
                              a.temperature, tally) for i in range(a.streams)]
            last_t, last_tokens = t0, _metrics(url)["clops_generated_tokens_total"]
            print(f"{'min':>5} {'tok/s':>8} {'RSS MiB':>8} {'device MiB':>10} {'running':>7} "
                  f"{'waiting':>7} {'done':>6} {'left':>5} {'errors':>6}", flush=True)
            while time.monotonic() < stop:
                time.sleep(min(a.every, max(stop - time.monotonic(), 0.1)))
                m, now = _metrics(url), time.monotonic()
                tokens = m["clops_generated_tokens_total"]
                s = {"t_s": now - t0, "tok_s": (tokens - last_tokens) / (now - last_t),
                     "rss": _rss(proc.pid), "device": _device_bytes(proc.pid),
                     "running": m["clops_requests_running"],
                     "waiting": m["clops_requests_waiting"], "done": tally.done,
                     "left": tally.left, "errors": len(tally.errors)}
                samples.append(s)
                last_t, last_tokens = now, tokens
                devm = f"{s['device'] / 2**20:.0f}" if s["device"] is not None else "-"
                print(f"{s['t_s'] / 60:>5.1f} {s['tok_s']:>8.1f} {s['rss'] / 2**20:>8.0f} "
                      f"{devm:>10} {s['running']:>7.0f} {s['waiting']:>7.0f} {s['done']:>6} "
                      f"{s['left']:>5} {s['errors']:>6}", flush=True)
            for f in futs:
                f.result()
        # after the clients: idle, every block back, healthy
        deadline = time.monotonic() + 60
        while True:
            m = _metrics(url)
            idle = m["clops_requests_running"] == m["clops_requests_waiting"] == 0 and \
                m["clops_kv_blocks_free"] == m["clops_kv_blocks_total"]
            if idle or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        health = httpx.get(url + "/health", timeout=30)
    finally:
        stop_server()
    # the first minute warms up (kernels and step plans built as batch sizes first occur)
    warm = [s for s in samples if s["t_s"] >= 60] or samples
    third = max(len(warm) // 3, 1)
    first = statistics.median(s["tok_s"] for s in warm[:third])
    lastq = statistics.median(s["tok_s"] for s in warm[-third:])
    base = warm[0]

    def flat(key: str) -> bool | None:
        if base[key] is None or samples[-1][key] is None:
            return None
        grew = samples[-1][key] - base[key]
        return grew < max(64 << 20, 0.05 * base[key])

    verdict = {"steady": abs(lastq - first) <= 0.15 * first, "rss_flat": flat("rss"),
               "device_flat": flat("device"), "no_errors": not tally.errors,
               "idle_after": bool(idle), "healthy_after": health.status_code == 200}
    print(f"{os.path.basename(model)} on {dev}, {a.streams} streams, {a.minutes:g} min, "
          f"{a.leave:.0%} of requests left early, temperature {a.temperature:g}, "
          f"{platform.machine()}")
    print(f"requests done {tally.done}, left early {tally.left}, errors {len(tally.errors)}; "
          f"tok/s first third {first:.1f}, last third {lastq:.1f}; RSS {base['rss'] / 2**20:.0f}"
          f" -> {samples[-1]['rss'] / 2**20:.0f} MiB")
    for e in tally.errors[:10]:
        print("  error:", e)
    print("verdict:", ", ".join(f"{k} {'yes' if v else 'no' if v is not None else '-'}"
                                for k, v in verdict.items()))
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump({"bench": "soak_serve", "model": os.path.basename(model), "device": dev,
                   "streams": a.streams, "minutes": a.minutes, "leave": a.leave,
                   "temperature": a.temperature,
                   "new_tokens": a.new_tokens, "done": tally.done, "left": tally.left,
                   "errors": tally.errors[:100], "samples": samples, "verdict": verdict},
                  f, indent=1)
    return 0 if all(v is not False for v in verdict.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
