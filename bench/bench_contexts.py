"""Moving a tensor between two devices: ``to_device`` between devices of one context (a
device-side copy) beside the same move through the host (to_numpy + asarray), with numpy's
copy of the same bytes as the host's ceiling. Devices: the sub-devices of one split where the
device can be split, else two devices of one platform in one ``clops.context``. Medians; a
markdown table on stdout and bench/results/contexts[_<kind>].json.

    python bench/bench_contexts.py [--device SEL] [--quick]
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
from common import arg_parser, device_info, markdown_table, median_seconds, write_result

import clops

SIZES = [("1 MiB", 1 << 20), ("64 MiB", 64 << 20)]


def _pair(dev: clops.CLDevice) -> tuple[clops.CLDevice, clops.CLDevice] | None:
    if dev.partition_support()["max_sub_devices"] >= 2:
        a, b = dev.create_sub_devices(2)
        return a, b
    same = [d for d in clops.devices() if d.entry.platform.int_ptr == dev.entry.platform.int_ptr
            and d is not dev]
    if same:
        a, b = clops.context([dev, same[0]])
        return a, b
    return None


def main() -> None:
    args = arg_parser(__doc__).parse_args()
    dev = clops.device(args.device)
    pair = _pair(dev)
    if pair is None:
        print(f"{dev.name}: no second device of its platform and no fission; nothing to move "
              "between", file=sys.stderr)
        return
    a, b = pair
    repeat = 3 if args.quick else 9
    rows: list[dict[str, Any]] = []
    for label, nbytes in SIZES:
        x = clops.asarray(np.random.default_rng(0).random(nbytes // 4, np.float32), device=a)
        x.realize()
        a.synchronize()
        host = np.asarray(x)
        # each timed call ends when the copy is done on the device
        t_dev = median_seconds(lambda x=x: (x.to_device(b).realize(), b.synchronize()),
                               number=1, repeat=repeat)
        t_host = median_seconds(lambda x=x: (clops.asarray(x.to_numpy(), device=b).realize(),
                                             b.synchronize()), number=1, repeat=repeat)
        t_np = median_seconds(host.copy, number=1, repeat=repeat)
        np.testing.assert_array_equal(np.asarray(x.to_device(b)), host)
        rows.append({"size": label, "bytes": nbytes, "device_copy_ms": t_dev * 1e3,
                     "through_host_ms": t_host * 1e3, "numpy_copy_ms": t_np * 1e3,
                     "device_copy_GBps": nbytes / t_dev / 1e9,
                     "speedup_vs_host": t_host / t_dev, "of_numpy_copy": t_np / t_dev})
    print(f"{a} -> {b}, one context")
    print(markdown_table(
        ["size", "to_device ms", "through host ms", "numpy copy ms", "GB/s", "x host",
         "of numpy"],
        [[r["size"], r["device_copy_ms"], r["through_host_ms"], r["numpy_copy_ms"],
          r["device_copy_GBps"], r["speedup_vs_host"], r["of_numpy_copy"]] for r in rows]))
    name = "contexts" if dev.kind == "cpu" else f"contexts_{dev.kind}"
    print(write_result(name, {"device": device_info(dev), "pair": [str(a), str(b)],
                              "rows": rows}))


if __name__ == "__main__":
    main()
