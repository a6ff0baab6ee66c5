"""The engine's Prometheus metrics, for processes that serve Prometheus themselves.

:func:`text` is this process's metrics in the Prometheus text format (what ``gdpath serve
--metrics`` serves): bytes and descriptor pairs by operation, path, peer and outcome, fallbacks by
the finding id that says why, pair and transfer durations, posting cost per descriptor,
registered memory, transfers in flight, connected peers and errors by kind. Names, labels and
units: ``docs/metrics.md``.

:class:`Collector` hands the same metrics to a ``prometheus_client`` registry, so that a process
that already serves Prometheus (vLLM, SGLang) exposes gdpath's beside its own::

    import prometheus_client
    import gdpath.metrics
    prometheus_client.REGISTRY.register(gdpath.metrics.Collector())

``prometheus_client`` (PyPI) is needed for the collector only, and imported when it collects.
The metrics are the process's: every :class:`gdpath.Agent` adds to them. ``GDPATH_METRICS=0``
in the environment before the first transfer turns them off (the text is then empty).
"""

from __future__ import annotations

from typing import Any, Iterator

from . import _native

__all__ = ["Collector", "text"]


def text() -> str:
    """This process's gdpath metrics in the Prometheus text exposition format 0.0.4."""
    return _native.metrics_text()


class Collector:
    """A ``prometheus_client`` collector of gdpath's metrics: each collection parses a fresh
    :func:`text` with ``prometheus_client``'s own parser, so the families are exactly those
    ``gdpath serve --metrics`` serves. Register it once per registry (``registry.register``);
    a second registration fails there with duplicate names, as for any collector."""

    def collect(self) -> Iterator[Any]:
        from prometheus_client.parser import text_string_to_metric_families

        yield from text_string_to_metric_families(text())

    def describe(self) -> Iterator[Any]:
        """The families, so that a registry knows their names when this is registered (and
        refuses names it has already) whether or not it describes collectors itself."""
        return self.collect()
