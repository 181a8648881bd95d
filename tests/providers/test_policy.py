"""CLOPS_PROVIDERS parsing, shape classes, and the choice between providers and generated code
(measured once, remembered on disk, forced, denied, shown under CLOPS_DEBUG and in the
profiler), with a stand-in provider."""

from __future__ import annotations

import json
import os

import pytest

import clops
from clops import providers
from clops.providers import GENERATED, OpSpec, Provider, parse_policy, shape_class


class FakeProvider(Provider):
    """A provider whose availability, cost and calls the test controls."""

    name = "fake"
    specs = (OpSpec("gemm", frozenset({"float32"}), "contiguous"),)

    def __init__(self, cost: float = 1e-3, missing: str | None = None) -> None:
        super().__init__()
        self.cost = cost
        self.missing = missing
        self.measured = 0

    def load(self) -> None:
        if self.missing:
            raise OSError(self.missing)

    def estimate(self, op, device, dtype, shape_key):
        return self.cost

    def scratch_call(self, op, device, dtype, shape_key):
        raise AssertionError("measure is overridden")

    def measure(self, op, device, dtype, shape_key):
        self.measured += 1
        return self.cost


@pytest.fixture
def fake():
    p = FakeProvider()
    providers.register(p)
    yield p
    providers.unregister("fake")


def test_parse_policy():
    assert parse_policy(None).mode("clblast") == "auto"
    assert parse_policy("none").mode("clblast") == "deny"
    pol = parse_policy("clblast,-vkfft")
    assert (pol.mode("clblast"), pol.mode("vkfft"), pol.mode("other")) == ("auto", "deny", "deny")
    pol = parse_policy("all,-vkfft")
    assert (pol.mode("clblast"), pol.mode("vkfft")) == ("auto", "deny")
    assert parse_policy("+clblast").mode("clblast") == "force"
    assert parse_policy("clblast!").mode("clblast") == "force"
    assert parse_policy("+clblast").mode("vkfft") == "auto"
    assert parse_policy("none,+vkfft").mode("clblast") == "deny"
    with pytest.raises(ValueError, match="unknown provider 'nope'.*clblast"):
        parse_policy("nope", ["clblast", "vkfft"])


def test_shape_class():
    assert shape_class((100, 256, 3, 1, 0)) == (128, 256, 4, 1, 0)


def test_report_lists_every_provider(device):
    text = providers.report(device)
    assert "clblast" in text and "vkfft" in text


def test_measured_once_and_kept_on_disk(device, fake, clops_env, tmp_path):
    clops_env(CLOPS_PROVIDERS="fake")
    calls = []

    def generated():
        calls.append(1)
        return 2e-3

    assert providers.choose("gemm", device, "float32", (64, 64, 64), generated) is fake
    assert providers.choose("gemm", device, "float32", (60, 50, 33), generated) is fake
    assert fake.measured == 1 and len(calls) == 1  # one shape class, one measurement
    data = json.load(open(os.path.join(tmp_path, "providers.json")))
    (key, costs), = data.items()
    assert "gemm" in key and costs == {"fake": 1e-3, GENERATED: 2e-3}
    # a new process (here: forgotten in memory) reads the costs back without measuring
    providers.clear_choices()
    assert providers.choose("gemm", device, "float32", (64, 64, 64), generated) is fake
    assert fake.measured == 1 and len(calls) == 1
    assert providers.choices()[0].reason == "cached"


def test_generated_wins_when_cheaper(device, fake, clops_env):
    clops_env(CLOPS_PROVIDERS="fake")
    fake.cost = 5e-3
    assert providers.choose("gemm", device, "float32", (8, 8, 8), lambda: 1e-3) is None
    d = providers.choices()[0]
    assert d.choice == GENERATED and d.reason == "measured"


def test_force_deny_none(device, fake, clops_env):
    fake.cost = 5e-3
    clops_env(CLOPS_PROVIDERS="+fake")
    assert providers.choose("gemm", device, "float32", (8, 8, 8), lambda: 1e-3) is fake
    assert fake.measured == 0
    clops_env(CLOPS_PROVIDERS="-fake,-clblast")
    assert providers.choose("gemm", device, "float32", (8, 8, 8), lambda: 1e-9) is None
    clops_env(CLOPS_PROVIDERS="none")
    assert providers.choose("gemm", device, "float32", (8, 8, 8)) is None


def test_capability_first(device, fake, clops_env):
    clops_env(CLOPS_PROVIDERS="none,+fake")
    assert providers.choose("gemm", device, "float64", (8, 8, 8)) is None  # dtype
    assert providers.choose("fft", device, "float32", (8, 8)) is None  # op
    fake.missing = "libfake.so: cannot open shared object file"
    fake._loaded = False
    assert providers.choose("gemm", device, "float32", (8, 8, 8)) is None  # library
    assert "libfake.so" in fake.cannot("gemm", device, "float32")


def test_without_generated_cost_a_capable_provider_is_used(device, fake, clops_env):
    clops_env(CLOPS_PROVIDERS="fake")
    assert providers.choose("gemm", device, "float32", (8, 8, 8)) is fake
    assert fake.measured == 0 and providers.choices()[0].reason == "only"


def test_a_failing_measurement_loses(device, fake, clops_env):
    clops_env(CLOPS_PROVIDERS="fake")

    def broken(*args):
        raise RuntimeError("library crashed")

    fake.measure = broken
    assert providers.choose("gemm", device, "float32", (8, 8, 8), lambda: 1.0) is None


def test_choice_printed_under_debug_and_in_profiler(device, fake, clops_env, capsys):
    clops_env(CLOPS_PROVIDERS="fake", CLOPS_DEBUG="1")
    with clops.profile() as prof:
        providers.choose("gemm", device, "float32", (8, 8, 8), lambda: 1.0)
    err = capsys.readouterr().err
    assert "provider choice: gemm float32 [8x8x8]" in err and "fake" in err
    marks = [r for r in prof.records if r.kind == "marker" and r.name.startswith("choose")]
    assert marks and marks[0].extra["choice"] == "fake"


def test_a_damaged_cost_table_is_read_entry_by_entry(tmp_path, clops_env, monkeypatch):
    import json
    import os

    from clops.providers import registry

    clops_env(CLOPS_CACHE_DIR=str(tmp_path), CLOPS_DISK_CACHE="1")
    path = tmp_path / "providers.json"
    path.write_text(json.dumps({"a": [1], "b": {"clblast": "x", "generated": 1.5}, "c": 3}))
    monkeypatch.setattr(registry, "_COSTS", None)
    assert registry._costs() == {"b": {"generated": 1.5}}
    for bad in ("[1, 2]", "{{{", "[" * 100000):
        path.write_text(bad)
        monkeypatch.setattr(registry, "_COSTS", None)
        assert registry._costs() == {}
    path.unlink()
    os.mkfifo(path)  # a pipe there must not block the reader
    monkeypatch.setattr(registry, "_COSTS", None)
    assert registry._costs() == {}


def test_float16_products_stay_off_providers_unless_forced(device, fake, clops_env):
    # a provider that adds float16 up in half precision (CLBlast; numpy and clops add up in
    # float32) declares it: the automatic choice never hands it a float16 product, however
    # cheap it says it is
    from clops.array import dispatch
    from clops.providers.clblast import CLBlastProvider

    assert all("float16" in s.forced_only for s in CLBlastProvider.specs)
    fake.specs = (OpSpec("gemm", frozenset({"float32", "float16"}), "contiguous",
                         forced_only={"float16": "adds float16 up in half precision"}),)
    fake.cost = 1e-9
    clops_env(CLOPS_PROVIDERS="fake")
    a = clops.ones((64, 64), dtype=clops.float16, device=device)
    assert dispatch.matmul(a, a, generated_cost=lambda: 1.0) is None
    assert fake.measured == 0
    clops_env(CLOPS_PROVIDERS="+fake")
    assert providers.choose("gemm", device, "float16", (64, 64, 64)) is fake  # forced: taken


def test_forces_any_follows_the_policy(fake, clops_env):
    from clops.providers import registry

    for text, forcing in (("all", False), ("none", False), ("fake", False),
                          ("-fake", False), ("+fake", True), ("none,+fake", True),
                          ("fake!", True), ("+fake,-fake", False)):
        clops_env(CLOPS_PROVIDERS=text)
        assert registry.forces_any() is forcing, text
