"""``clops.serve.ray``: two replicas of ``clops serve`` on a local Ray cluster behind one endpoint;
requests reach both, and every answer equals a lone server's. Mistakes are one line."""

from __future__ import annotations

import json
import os
import socket
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

import clops.llm
from clops.serve.cli import main

from ..llm.tiny import make_model
from .conftest import start

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # (Ray's, of pydantic)

CTX = 128
REPLICAS = 2


def test_more_replicas_than_devices_is_one_line(capsys, monkeypatch):
    pytest.importorskip("ray.serve")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # (a local cluster: this host's devices)
    assert main(["--ray", "--replicas", "3", "--replica-device", "cpu",
                 "--replica-device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("clops serve: error: 3 replicas") and \
        "at most 2" in err, err


def test_without_ray_it_says_what_to_install(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # (import ray fails as if not installed)
    assert main(["--ray"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'clops-opencl[ray]'" in err, err


@pytest.mark.parametrize("args,words", [
    (["--replicas", "2"], "--replicas goes with --ray"),
    (["--replica-device", "cpu", "--ray-address", "auto"],
     "--replica-device, --ray-address go with --ray"),
    (["--ray", "--device", "cpu", "--replica-device", "cpu"], "both given"),
])
def test_rays_options_are_checked(capsys, args, words):
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err


def test_import_clops_serve_leaves_ray_out():
    import subprocess

    code = "import sys, clops, clops.serve; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "False"


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    pytest.importorskip("torch")
    path = tmp_path_factory.mktemp("ray_tiny")
    make_model(str(path), "llama")
    return str(path)


@pytest.fixture(scope="module")
def lone(tiny_path):
    pytest.importorskip("httpx")
    model = clops.llm.load(tiny_path, progress=False, max_seq_len=CTX, kv_cache="float32")
    run = start(model, parallel=4, model_name="tiny")
    yield run
    run.stop()


@pytest.fixture(scope="module")
def cluster(tiny_path):
    ray = pytest.importorskip("ray")
    serve = pytest.importorskip("ray.serve")
    from clops.serve.ray import Spec, run

    # the replicas' processes take the test's device choice
    env = {k: v for k, v in os.environ.items() if k.startswith("CLOPS_")}
    ray.init(num_cpus=REPLICAS, object_store_memory=100 << 20, include_dashboard=False,
             runtime_env={"env_vars": env}, log_to_driver=False)
    try:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        sock.close()
        spec = Spec(model=tiny_path, devices=(None,) * REPLICAS, ctx_size=CTX,
                    kv_cache="float32", parallel=4, name="tiny")
        yield run(spec, REPLICAS, port=port)
    finally:
        serve.shutdown()
        ray.shutdown()


def _bodies(n: int) -> list[tuple[str, dict]]:
    out = []
    for i in range(n):
        if i % 3 == 2:
            out.append(("/v1/chat/completions", {
                "model": "tiny", "temperature": 0, "max_tokens": 6,
                "messages": [{"role": "user", "content": f"w{i} w{2 * i + 1} w7"}]}))
        else:
            out.append(("/v1/completions", {
                "model": "tiny", "temperature": 0, "max_tokens": 8,
                "prompt": [1 + i, 40 + 3 * i, 9, 200 - i]}))
    return out


def _answer(body: dict) -> tuple:
    """What must equal between servers: the choices and the usage (not ids or times)."""
    return body["object"], body["model"], body["choices"], body["usage"]


def _streamed(url: str, body: dict) -> tuple[str, list]:
    """A streamed completion's text and finish reason, from its server-sent events (how the
    text is cut into events depends on timing)."""
    import httpx

    text, ends = "", []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if line.startswith("data: {"):
                for c in json.loads(line[6:])["choices"]:
                    text += c["text"]
                    ends += [c["finish_reason"]] if c["finish_reason"] else []
    return text, ends


def test_requests_reach_both_replicas_and_answers_equal_a_lone_servers(cluster, lone):
    import httpx

    seen: set[str] = set()
    checked = 0
    with httpx.Client(timeout=120) as client, ThreadPoolExecutor(8) as pool:
        # batches of 8 at once until both replicas have answered (Ray spreads them)
        for batch in range(8):
            bodies = _bodies(8 * (batch + 1))[8 * batch:]
            replies = list(pool.map(lambda pb: client.post(cluster + pb[0], json=pb[1]),
                                    bodies))
            for (path, body), reply in zip(bodies, replies):
                assert reply.status_code == 200, reply.text
                seen.add(reply.headers["x-clops-replica"])
                alone = client.post(lone.url + path, json=body)
                assert alone.status_code == 200, alone.text
                assert _answer(reply.json()) == _answer(alone.json()), (path, body)
                checked += 1
            if len(seen) == REPLICAS:
                break
    assert len(seen) == REPLICAS, f"only replica {seen} answered {checked} requests"
    body = {"model": "tiny", "temperature": 0, "max_tokens": 8, "stream": True,
            "prompt": [5, 6, 7, 8]}
    assert _streamed(cluster, body) == _streamed(lone.url, body)
    models = httpx.get(cluster + "/v1/models", timeout=60).json()
    assert [m["id"] for m in models["data"]] == ["tiny"]
    assert httpx.get(cluster + "/health", timeout=60).json()["status"] == "ok"
