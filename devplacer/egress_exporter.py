"""Fake node_exporters for the egress-load tests: each serves one pool node's transmit counter.

`EgressExporter(node)` serves `/metrics` on 127.0.0.1 (a thread of the calling process, through
prometheus_client's exposition) with one series,
`node_network_transmit_bytes_total{device="eth0"}`: a counter that grows at the rate the caller
sets (`set_rate`, bytes per second), so a real Prometheus scraping it computes that rate back.
`egress_load_block` is the policy's `egressLoad` that reads it through Prometheus.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, Metric

from devcluster.prometheus import NODE_LABEL  # the label the Prometheus scrape configs put on each exporter's series

DEVICE = "eth0"
# Per node, bytes per second sent through eth0 over the last 5 s (5 samples at a 1 s scrape interval).
EGRESS_QUERY = f'sum by ({NODE_LABEL}) (rate(node_network_transmit_bytes_total{{device="{DEVICE}"}}[5s]))'


class TransmitCounter:
    """Bytes sent so far at a settable rate: a counter that never goes down (a Prometheus collector)."""

    def __init__(self, bytes_per_second: float = 0.0, clock: Callable[[], float] = time.monotonic) -> None:
        if bytes_per_second < 0:
            raise ValueError("a transmit rate is not negative")
        self._clock = clock
        self._lock = threading.Lock()
        self._sent = 0.0
        self._rate = bytes_per_second
        self._since = clock()

    @property
    def rate(self) -> float:
        return self._rate

    def value(self) -> float:
        with self._lock:
            return self._sent + self._rate * (self._clock() - self._since)

    def set_rate(self, bytes_per_second: float) -> None:
        """From now on the counter grows by `bytes_per_second` each second (what was sent is kept)."""
        if bytes_per_second < 0:
            raise ValueError("a transmit rate is not negative")
        with self._lock:
            now = self._clock()
            self._sent += self._rate * (now - self._since)
            self._since, self._rate = now, bytes_per_second

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "node_network_transmit_bytes", "Network device statistic transmit_bytes.", labels=["device"]
        )
        family.add_metric([DEVICE], self.value())
        yield family


class LoopbackExporter:
    """A /metrics endpoint on 127.0.0.1 serving `registry`: `start()` returns its URL; `stop()` ends it."""

    def __init__(self) -> None:
        self._registry = CollectorRegistry(auto_describe=False)
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError(f"{self} is not started")
        return f"http://127.0.0.1:{self._server.server_port}/metrics"

    def start(self) -> str:
        if self._server is None:
            self._server, self._thread = start_http_server(0, addr="127.0.0.1", registry=self._registry)
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            if self._thread is not None:
                self._thread.join(timeout=5)
            self._server = self._thread = None


class EgressExporter(LoopbackExporter):
    """One pool node's exporter: `start()` returns its /metrics URL; `stop()` ends it."""

    def __init__(self, node: str, bytes_per_second: float = 0.0) -> None:
        super().__init__()
        self.node = node
        self.counter = TransmitCounter(bytes_per_second)
        self._registry.register(self.counter)

    def __str__(self) -> str:
        return f"the exporter of {self.node}"

    def set_rate(self, bytes_per_second: float) -> None:
        self.counter.set_rate(bytes_per_second)


def start_exporters(rates: Mapping[str, float]) -> dict[str, EgressExporter]:
    """One started exporter per node, sending at the given bytes per second."""
    exporters = {node: EgressExporter(node, rate) for node, rate in rates.items()}
    try:
        for exporter in exporters.values():
            exporter.start()
    except BaseException:
        stop_exporters(exporters.values())
        raise
    return exporters


def stop_exporters(exporters: Iterable[EgressExporter]) -> None:
    for exporter in exporters:
        exporter.stop()


def egress_load_block(prometheus_url: str, bandwidth_bytes_per_second: float) -> dict[str, Any]:
    """A pool's `egressLoad` reading these exporters through Prometheus: polled every second, a
    figure older than 15 s is stale (node choice falls back to run counts)."""
    return {
        "prometheus": {
            "url": prometheus_url,
            "query": EGRESS_QUERY,
            "nodeLabel": NODE_LABEL,
            "interval": "1s",
            "maxAge": "15s",
        },
        "bandwidthBytesPerSecond": bandwidth_bytes_per_second,
    }
