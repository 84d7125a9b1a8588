"""hsstore.vllm.metrics takes the tiers from the store's ``stats()["tiers"]``: every row, by its
name (a tier it has never heard of, such as a device row, included), and /metrics gets series for a
tier not declared up front the first time it is reported. No engine: flatten() and the Prometheus
side are fed by hand, into a registry of their own."""

import functools
import types

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from hsstore.vllm import metrics


def test_flatten_takes_every_row_of_the_stores_tiers_by_its_name():
    stats = {"store_stats": {"tiers": [
        {"name": "device", "hits": 3, "misses": 1, "queue_bytes": 5},
        {"name": "disk", "hits": 1, "dropped_writes": 2},
        {"name": "", "hits": 9},  # a row without a name is no series
    ]}}
    flat = metrics.flatten(stats)
    assert flat["counters"] == {"device_hits": 3, "device_misses": 1, "disk_hits": 1,
                                "disk_dropped_writes": 2}
    assert flat["gauges"] == {"device_queue_bytes": 5}


def test_prometheus_series_of_a_tier_not_declared_up_front_are_made_when_first_reported():
    registry = CollectorRegistry()
    metric_types = {cls: functools.partial(cls, registry=registry)
                    for cls in (Counter, Gauge, Histogram)}
    labels = {"model_name": "m", "engine": "0"}
    config = types.SimpleNamespace(kv_transfer_config=None)
    prom = metrics.HiddenStatePromMetrics(config, metric_types, list(labels),
                                          {0: list(labels.values())})
    # The declared tiers are there from the start, at zero.
    assert registry.get_sample_value("hsstore:disk_hits_total", labels) == 0
    assert registry.get_sample_value("hsstore:device_hits_total", labels) is None
    prom.observe({"counters": {"device_hits": 2, "rows_restored": 4, "not_a_metric": 1,
                               "bad-name_hits": 1},
                  "gauges": {"w0": {"device_queue_bytes": 7}}})
    assert registry.get_sample_value("hsstore:device_hits_total", labels) == 2
    assert registry.get_sample_value("hsstore:device_queue_bytes", labels) == 7
    assert registry.get_sample_value("hsstore:rows_restored_total", labels) == 4
    assert registry.get_sample_value("hsstore:not_a_metric_total", labels) is None
    assert registry.get_sample_value("hsstore:bad-name_hits_total", labels) is None
    prom.observe({"counters": {"device_hits": 1}, "gauges": {}})
    assert registry.get_sample_value("hsstore:device_hits_total", labels) == 3
