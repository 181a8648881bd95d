"""cli, serve on Ray: ``clops serve --ray``, the server's replicas on Ray Serve
(``clops.serve.ray``), one per ``--replica-device`` on each host, behind one endpoint. The
options are ``clops serve``'s and a few of Ray's; what can be checked here is checked before Ray
starts, each mistake one line and status 2."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import TYPE_CHECKING

from .. import _config
from . import args as cli
from .args import USAGE_ERROR, one_line

if TYPE_CHECKING:
    from ..serve.ray import Spec


def add_options(ap: argparse.ArgumentParser) -> None:
    """--ray, --replica-device, --replicas, --ray-address, --cpus-per-replica."""
    g = ap.add_argument_group("replicas on Ray Serve (pip install 'clops-opencl[ray]')")
    g.add_argument("--ray", action="store_true",
                   help="serve replicas on Ray Serve behind one endpoint, one per "
                        "--replica-device on each host")
    g.add_argument("--replica-device", dest="replica_devices", action="append", default=None,
                   type=cli.text("device selector"), metavar="SEL",
                   help="with --ray: the device of one replica on each host, given once per "
                        "replica (a list such as gpu:0,gpu:1 splits that replica's model as "
                        "--device does); default: --device, one replica per host")
    g.add_argument("--replicas", type=cli.whole(1), default=None, metavar="N",
                   help="with --ray: replicas in all (default: one per --replica-device)")
    g.add_argument("--ray-address", default=None, type=cli.text("Ray address"), metavar="ADDR",
                   help="with --ray: the Ray cluster to join (default: RAY_ADDRESS, else a new "
                        "local one)")
    g.add_argument("--cpus-per-replica", type=cli.number(0.0), default=None, metavar="N",
                   help="with --ray: the CPUs Ray reserves for each replica (default 1)")


def wanted(ap: argparse.ArgumentParser, a: argparse.Namespace) -> bool:
    """Whether ``--ray`` was given (Ray's options without it are a mistake)."""
    if not a.ray:
        given = [name for name, v in (("--replica-device", a.replica_devices),
                                      ("--replicas", a.replicas),
                                      ("--ray-address", a.ray_address),
                                      ("--cpus-per-replica", a.cpus_per_replica)) if v is not None]
        if given:
            ap.error(f"{', '.join(given)} go{'es' if len(given) == 1 else ''} with --ray")
    elif a.replica_devices and a.device is not None:
        ap.error("--device and --replica-device both given: with --ray give --replica-device "
                 "once per replica on a host, or --device for one replica per host")
    return bool(a.ray)


def spec_of(a: argparse.Namespace) -> Spec:
    from ..serve.limits import Limits
    from ..serve.ray import Spec

    devices = tuple(a.replica_devices) if a.replica_devices else (a.device,)
    origins = tuple(o.strip() for o in a.cors_origins.split(",") if o.strip())
    limits = Limits(api_key=a.api_key or _config.api_key(), max_body=a.max_body,
                    read_timeout=a.timeout, cors_origins=origins)
    return Spec(model=a.model, devices=devices, ctx_size=a.ctx_size, kv_cache=a.kv_cache,
                tensor_split=tuple(a.tensor_split) if a.tensor_split else None,
                parallel=a.parallel, queue=a.queue, name=a.name, max_tokens=a.max_tokens,
                parse_special=a.parse_special, row_invariant=a.row_invariant, limits=limits)


def main(a: argparse.Namespace, prog: str) -> int:
    """Deploy the replicas, say where, and serve until Ctrl-C."""
    from ..serve import ray as replicas

    spec = spec_of(a)
    n = len(spec.devices) if a.replicas is None else a.replicas
    try:
        replicas.serve_module()
        if a.ray_address is None and not os.environ.get("RAY_ADDRESS"):
            # a new local cluster: this host's devices, checked before Ray starts
            replicas.check(spec, n, 1)
            for selector in dict.fromkeys(spec.devices):
                for one in (selector or "").split(",") if selector else [None]:
                    cli.open_device(one)
        cli.check_model_path(spec.model)
    except (ImportError, ValueError, cli.Refused) as e:
        print(f"{prog}: error: {one_line(str(e))}", file=sys.stderr)
        return USAGE_ERROR
    import ray

    ray.init(address=a.ray_address)
    try:
        cpus = 1.0 if a.cpus_per_replica is None else a.cpus_per_replica
        url = replicas.run(spec, n, a.host, a.port, cpus)
    except (ValueError, RuntimeError) as e:
        print(f"{prog}: error: {one_line(str(e))}", file=sys.stderr)
        ray.shutdown()
        return USAGE_ERROR if isinstance(e, ValueError) else 1
    name = spec.name or (os.path.basename(spec.model) if spec.model else "the bundled SmolLM2")
    key = " (API key required)" if spec.limits.api_key else ""
    print(f"{prog}: {n} replicas of {name} on Ray Serve, {url}/{key}", file=sys.stderr)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    from ray import serve

    serve.shutdown()
    ray.shutdown()
    return 0
