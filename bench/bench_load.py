"""How long a model takes to load, beside the floor of reading its file: for a GGUF file,

- the floor: its tensors' bytes read once from the page cache (a copy out of the memory map,
  after a first read that warms it), and the device's upload of that many bytes
  (``dev.write``) — what any loader that keeps the file's bytes pays;
- each weight type's repacking into clops' device formats (``nn.quant.pack_ggml``) on one
  thread, over all of the file's tensors of that type: values a second;
- ``clops.llm.load`` whole (weights packed, checked and uploaded, no kernels built), on one
  thread and on ``LOAD_THREADS``, each the median of ``--repeat`` loads in turns: seconds, the
  file's GB a second, and the floor's time over it.

    python bench/bench_load.py -m model.gguf [--device gpu] [--repeat 3] [--json OUT]
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import clops  # noqa: E402
import clops.llm  # noqa: E402
from bench.common import arg_parser, device_info, write_json  # noqa: E402
from clops.llm import model as model_mod  # noqa: E402
from clops.llm.gguf_file import GGUFFile, ggml_type_name  # noqa: E402
from clops.nn.quant import BLOCKS, pack_ggml  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = arg_parser(__doc__)
    ap.add_argument("-m", "--model", required=True, help="a GGUF file")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    dev = clops.device(args.device)
    f = GGUFFile(args.model)
    tensors = list(f.tensors.values())
    nbytes = sum(int(t.data.nbytes) for t in tensors)

    def read_all() -> None:
        for t in tensors:
            np.array(t.data, copy=True)

    read_all()  # (into the page cache)
    t0 = time.perf_counter()
    read_all()
    read_s = time.perf_counter() - t0
    biggest = max(int(t.data.nbytes) for t in tensors)
    buf = dev.alloc(biggest)
    host = np.ones(biggest, np.uint8)
    dev.write(buf, host, blocking=True)
    t0 = time.perf_counter()
    for t in tensors:
        dev.write(buf, host[: int(t.data.nbytes)], blocking=True)
    upload_s = time.perf_counter() - t0
    floor_s = read_s + upload_s
    print(f"{os.path.basename(args.model)}: {nbytes / 1e9:.2f} GB of tensors on "
          f"{dev.name}; floor {floor_s:.2f} s (read {nbytes / read_s / 1e9:.1f} GB/s, upload "
          f"{nbytes / upload_s / 1e9:.1f} GB/s)", flush=True)

    types: dict[str, dict] = {}
    for t in tensors:
        if t.ggml_type not in BLOCKS or len(t.shape) < 2:
            continue
        k = t.shape[-1]
        n = int(np.prod(t.shape[:-1]))
        t0 = time.perf_counter()
        pack_ggml(t.data, t.ggml_type, n, k)
        row = types.setdefault(ggml_type_name(t.ggml_type), {"values": 0, "bytes": 0, "s": 0.0})
        row["values"] += n * k
        row["bytes"] += int(t.data.nbytes)
        row["s"] += time.perf_counter() - t0
    for name, row in sorted(types.items()):
        row["gvalues_per_s"] = row["values"] / row["s"] / 1e9
        print(f"  pack {name:7s} {row['values'] / 1e9:6.2f} G values in {row['s']:6.2f} s: "
              f"{row['gvalues_per_s']:.2f} G values/s, {row['bytes'] / row['s'] / 1e9:.2f} GB/s "
              "of the file (one thread)", flush=True)

    threads = sorted({1, model_mod.LOAD_THREADS})
    samples: dict[int, list[float]] = {n: [] for n in threads}
    default = model_mod.LOAD_THREADS
    try:
        for _ in range(args.repeat):
            for n in threads:
                model_mod.LOAD_THREADS = n
                t0 = time.perf_counter()
                m = clops.llm.load(args.model, device=dev, max_seq_len=64, progress=False)
                dev.synchronize()
                samples[n].append(time.perf_counter() - t0)
                del m
    finally:
        model_mod.LOAD_THREADS = default
    loads = {}
    for n in threads:
        s = statistics.median(samples[n])
        loads[str(n)] = {"s": s, "samples": samples[n], "gbps": nbytes / s / 1e9,
                         "of_floor": floor_s / s}
        print(f"  load on {n} thread(s): {s:.2f} s (median of {len(samples[n])}), "
              f"{nbytes / s / 1e9:.2f} GB/s of the file, the floor's time {floor_s / s:.2f}x "
              "of it", flush=True)
    if args.json:
        write_json(args.json, {"bench": "load", "model": os.path.basename(args.model),
                               "device": device_info(dev), "cpus": os.cpu_count(),
                               "tensor_bytes": nbytes, "read_s": read_s,
                               "upload_s": upload_s, "floor_s": floor_s, "pack": types,
                               "loads": loads})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
