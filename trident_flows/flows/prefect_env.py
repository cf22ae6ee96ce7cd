"""The Prefect settings Ray workers need: the API URL of a real Prefect server.

Contract: ``worker_env()`` returns the environment variables to hand to Ray workers so the
Prefect task runs they execute report to the same server as the flow. Without a configured
``PREFECT_API_URL`` every Ray worker would start its own temporary Prefect server (a 3 s flow
becomes a minute), so it refuses with a message saying how to set one.
"""

from __future__ import annotations

from prefect.settings import get_current_settings


class PrefectServerRequired(RuntimeError):
    """Raised when a flow that runs tasks on Ray has no Prefect server to report to."""


def worker_env() -> dict[str, str]:
    """``{"PREFECT_API_URL": ...}`` (plus the API key when one is set) for Ray workers."""
    settings = get_current_settings()
    url = settings.api.url
    if not url:
        raise PrefectServerRequired(
            "PREFECT_API_URL is not set: task runs on Ray workers need a real Prefect server. Start one with "
            "`prefect server start` (or trident_flows.prefect_server.ensure_server()) and export "
            "PREFECT_API_URL=http://127.0.0.1:4200/api")
    env = {"PREFECT_API_URL": str(url)}
    if settings.api.key is not None:
        env["PREFECT_API_KEY"] = settings.api.key.get_secret_value()
    return env
