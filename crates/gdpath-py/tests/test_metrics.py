"""``gdpath.metrics``: the engine's metrics after real transfers, as text and through a
``prometheus_client`` registry (the collector a vLLM or SGLang process registers)."""

from __future__ import annotations


import numpy as np
import pytest

import gdpath
import gdpath.metrics

HOST_COPY = {"op": "write", "path": "host-copy", "peer": "local", "outcome": "ok"}


def value(text: str, name: str, labels: dict) -> float:
    """The sample `name{labels}` in a Prometheus text (labels in any order), 0 when absent."""
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        inner, _, v = line[len(name) + 1:].rpartition("} ")
        got = dict(kv.split("=", 1) for kv in inner.split(","))
        if got == {k: f'"{x}"' for k, x in labels.items()}:
            return float(v)
    return 0.0


def host_copy(agent, n: int) -> None:
    src = agent.register(np.full(n, 7, dtype=np.uint8))
    dst = agent.register(np.zeros(n, dtype=np.uint8))
    assert agent.post("write", src, dst).wait().pairs[0].path == "host-copy"


def test_text_counts_the_bytes_a_host_copy_moved(agent):
    before = gdpath.metrics.text()
    host_copy(agent, 3 << 20)
    after = gdpath.metrics.text()
    assert value(after, "gdpath_bytes_total", HOST_COPY) - value(before, "gdpath_bytes_total", HOST_COPY) == 3 << 20
    assert value(after, "gdpath_pairs_total", HOST_COPY) - value(before, "gdpath_pairs_total", HOST_COPY) == 1
    assert "# TYPE gdpath_pair_duration_seconds histogram" in after
    assert "gdpath_transfers_in_flight 0\n" in after


def test_the_collector_feeds_a_prometheus_client_registry(agent):
    prometheus_client = pytest.importorskip(
        "prometheus_client", reason="prometheus_client not installed (scripts/setup.sh installs it)"
    )
    registry = prometheus_client.CollectorRegistry()
    registry.register(gdpath.metrics.Collector())
    before = registry.get_sample_value("gdpath_bytes_total", HOST_COPY) or 0.0
    host_copy(agent, 1 << 20)
    assert registry.get_sample_value("gdpath_bytes_total", HOST_COPY) - before == 1 << 20
    # What the registry serves parses back with the same series the engine wrote.
    out = prometheus_client.generate_latest(registry).decode()
    assert value(out, "gdpath_bytes_total", HOST_COPY) == value(gdpath.metrics.text(), "gdpath_bytes_total", HOST_COPY)
    assert "gdpath_registered_bytes" in out
    # A second registration of the same names is refused, as for any collector.
    with pytest.raises(ValueError):
        registry.register(gdpath.metrics.Collector())
