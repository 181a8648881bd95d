"""serve, ray: replicas of ``clops serve`` on Ray Serve, one per device on each host, behind one
OpenAI-compatible endpoint (``clops serve --ray -m MODEL --replica-device gpu:0
--replica-device gpu:1``).

Each replica is a Ray actor that loads the model itself, on its own device, and serves the same
ASGI app as ``clops serve`` (``create_app`` over a ``Server`` and its engine thread); Ray Serve's
proxy on every host takes the requests and sends each to the least busy replica. ``devices``
holds one selector per replica on a host (a replica takes the one of its rank on its host, so
``("gpu:0", "gpu:1")`` puts two replicas on a host's two GPUs, ``("gpu:0,gpu:1",
"gpu:2,gpu:3")`` two replicas each split over two, and no host gets more replicas than
selectors); every answer names its replica in the ``x-clops-replica`` header. A replica whose
engine thread stops fails Ray's health check, and Ray starts another. Needs the ``ray`` extra:
``pip install 'clops-opencl[ray]'``; ``import clops.serve`` does not import Ray.

Example (Python; a Ray cluster is joined, or a local one started, by ``ray.init``)::

    import ray
    from clops.serve.ray import Spec, run

    ray.init()
    url = run(Spec(model="model.gguf", devices=("gpu:0", "gpu:1")), port=8000)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from .limits import Limits

APP_NAME = "clops"
HEADER = b"x-clops-replica"
INSTALL = "pip install 'clops-opencl[ray]'"


@dataclass(frozen=True)
class Spec:
    """What every replica serves: ``clops serve``'s options. ``devices``: one device selector
    per replica on a host (None: ``CLOPS_DEVICE`` or the best device; a comma-separated list
    splits the replica's model over those devices, as ``clops.llm.load``), taken by each
    replica's rank on its host; ``model`` None: the bundled SmolLM2."""

    model: str | None = None
    devices: tuple[str | None, ...] = (None,)
    ctx_size: int | None = 4096
    kv_cache: str | None = None
    # each device's share of the layers, where a replica's model is split over several
    tensor_split: tuple[float, ...] | None = None
    parallel: int = 4
    queue: int = 64
    name: str | None = None
    max_tokens: int | None = None
    parse_special: bool = False
    row_invariant: bool = False
    prefill_chunk: int = 64
    limits: Limits = field(default_factory=Limits)


class Replica:
    """One replica (a Ray actor, a process of its own): the model on the device of its rank, the
    engine's thread and ``clops serve``'s app, which Ray Serve's ingress then takes from
    ``_this_replicas_app``."""

    def __init__(self, spec: Spec) -> None:
        from ray import serve

        from ..llm import load
        from .app import Server, create_app

        ctx = serve.get_replica_context()
        model = load(spec.model, device=_selector(spec.devices, ctx.rank),
                     max_seq_len=spec.ctx_size, progress=False, kv_cache=spec.kv_cache,
                     split=spec.tensor_split)
        name = spec.name or os.path.basename(spec.model or model.source_path)
        self.server = Server(model, parallel=spec.parallel, queue_limit=spec.queue,
                             model_name=name, prefill_chunk=spec.prefill_chunk,
                             max_tokens=spec.max_tokens, parse_special=spec.parse_special,
                             row_invariant=spec.row_invariant)
        _BUILT.append(Named(create_app(self.server, spec.limits), ctx.replica_tag.encode()))

    def check_health(self) -> None:
        """Ray's health check: an engine that cannot serve (its thread stopped, a step stalled)
        fails it, and Ray replaces the replica."""
        ok, why = self.server.runner.health()
        if not ok:
            raise RuntimeError(f"clops engine: {why}")


# The app each replica's constructor made, for the ingress builder run right after it in the same
# process (Ray Serve calls the builder without arguments)
_BUILT: list[Any] = []


def _this_replicas_app() -> Any:
    return _BUILT.pop()


def _selector(devices: tuple[str | None, ...], rank: Any) -> str | None:
    """The device selector of the replica of ``rank`` (Ray's ``ReplicaRank``)."""
    if len(devices) == 1:
        return devices[0]
    local = getattr(rank, "local_rank", None)
    if local is None or local < 0:
        raise RuntimeError("this Ray gives a replica no rank on its host, so it cannot take one "
                           f"of the devices {', '.join(map(str, devices))}: upgrade Ray "
                           f"({INSTALL})")
    if local >= len(devices):
        raise RuntimeError(f"replica {local} of its host has no device: {len(devices)} given "
                           f"({', '.join(map(str, devices))})")
    return devices[local]


class Named:
    """An ASGI app whose responses carry ``x-clops-replica``: which replica answered."""

    def __init__(self, app: Any, replica: bytes) -> None:
        self.app, self.replica = app, replica

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def named(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()),
                                                  (HEADER, self.replica)]}
            await send(message)

        await self.app(scope, receive, named)


def serve_module() -> Any:
    """``ray.serve``, or ImportError saying what to install."""
    try:
        from ray import serve
    except ImportError:
        raise ImportError(f"Ray Serve is not installed: {INSTALL}") from None
    return serve


def application(spec: Spec, replicas: int | None = None, cpus_per_replica: float = 1.0) -> Any:
    """The Ray Serve application of ``replicas`` replicas of ``spec`` (default: one per selector
    in ``spec.devices``), each asking Ray for ``cpus_per_replica`` CPUs; deploy it with
    ``ray.serve.run`` (or ``run`` below, which checks the cluster first)."""
    serve = serve_module()
    n = len(spec.devices) if replicas is None else replicas
    if n < 1:
        raise ValueError(f"replicas must be 1 or more, not {n}")
    ingress = serve.ingress(_this_replicas_app)(Replica)
    deployment = serve.deployment(
        ingress, name=APP_NAME, num_replicas=n, max_replicas_per_node=len(spec.devices),
        # requests past a replica's slots and queue wait at Ray's router, for any replica
        max_ongoing_requests=spec.parallel + spec.queue,
        ray_actor_options={"num_cpus": cpus_per_replica})
    return deployment.bind(spec)


def hosts() -> int:
    """The hosts (live Ray nodes) of the cluster this process is connected to."""
    import ray

    return sum(1 for node in ray.nodes() if node.get("Alive"))


def check(spec: Spec, replicas: int, hosts: int) -> None:
    """Refuse (ValueError) what Ray could never place: more replicas than devices."""
    most = hosts * len(spec.devices)
    if replicas > most:
        listed = ", ".join(d or "the default device" for d in spec.devices)
        raise ValueError(f"{replicas} replicas, but the cluster has {hosts} host"
                          f"{'s' if hosts != 1 else ''} of {len(spec.devices)} device"
                          f"{'s' if len(spec.devices) != 1 else ''} each ({listed}): at most "
                          f"{most}; list more devices (one replica per device)")


def run(spec: Spec, replicas: int | None = None, host: str = "127.0.0.1", port: int = 8000,
        cpus_per_replica: float = 1.0) -> str:
    """Deploy ``replicas`` replicas of ``spec`` on the Ray cluster this process is connected to
    (``ray.init``), behind Ray Serve's proxy on ``host:port``; returns the endpoint's URL once
    every replica serves. A replica that cannot start (its device, its model) raises
    RuntimeError with the replica's own error."""
    serve = serve_module()
    n = len(spec.devices) if replicas is None else replicas
    check(spec, n, hosts())
    serve.start(http_options={"host": host, "port": port})
    try:
        serve.run(application(spec, n, cpus_per_replica), name=APP_NAME, route_prefix="/")
    except RuntimeError as e:
        raise RuntimeError(f"the clops replicas did not start: {_failure(serve) or e}") from None
    return f"http://{host}:{port}"


def _failure(serve: Any) -> str:
    """The last line of a failed replica's error (Ray keeps the whole traceback)."""
    app = serve.status().applications.get(APP_NAME)
    for d in getattr(app, "deployments", {}).values():
        lines = [line for line in str(d.message).splitlines() if line.strip()]
        if str(d.status).endswith("FAILED") and lines:
            return lines[-1]
    return ""
