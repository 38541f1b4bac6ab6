"""The metrics endpoint: the store collector built from the settings, in a registry of its
own, served over HTTP by whichever process mounts it (`fleet-import metrics serve`, a
worker, the relay). The collector reads the store at each scrape, so two processes serving
it say the same, and a process that serves it adds no state of its own."""

from __future__ import annotations

import threading
from typing import Any

from prometheus_client import CollectorRegistry, make_wsgi_app, start_http_server

from fleet_import.config import Settings
from fleet_import.contracts.files import contracts_in_force
from fleet_import.monitoring.collector import StoreCollector, TenantLabels
from fleet_import.store.metrics_repository import MetricsRepository
from fleet_import.tenants.registry import registry_in_force

DEFAULT_PORT = 9464
"""The metrics port when none is given (OpenMetrics exporters' registered default range)."""


def store_collector(settings: Settings) -> StoreCollector:
    """The collector over FLEET_DATABASE_URL, tenants labelled as FLEET_TENANTS bounds them,
    reject limits from the contracts in force."""
    registry = registry_in_force(settings.tenants)
    contracts = contracts_in_force(settings.contracts)
    return StoreCollector(
        MetricsRepository.from_settings(settings),
        TenantLabels(frozenset(registry.tenants) if registry is not None else frozenset()),
        {name: float(contract.max_reject_ratio) for name, contract in contracts.items()},
    )


def metrics_registry(collector: StoreCollector) -> CollectorRegistry:
    """A registry holding only the fleet's series (no process metrics of whoever serves)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def wsgi_app(collector: StoreCollector) -> Any:
    """The endpoint as a WSGI app, for a process that already serves HTTP."""
    return make_wsgi_app(metrics_registry(collector))


def start_endpoint(
    collector: StoreCollector, port: int = DEFAULT_PORT, addr: str = "0.0.0.0"
) -> tuple[Any, threading.Thread]:
    """Serve `/metrics` on a daemon thread: (the server, its thread). `port` 0 takes a free
    one (`server.server_port`)."""
    return start_http_server(port, addr=addr, registry=metrics_registry(collector))
