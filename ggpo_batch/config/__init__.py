"""Settings and identity: environment and settings file, who acts on the ledger, secrets masked,
where notices go. The names below keep `from ggpo_batch.config import load_settings` working; code
inside the package imports them from their modules.
"""

from .secrets import redact
from .settings import (
    DASHBOARD_TOKEN_ENV,
    MEMORY_REDIS,
    Settings,
    dashboard_token,
    environment,
    fault_pause,
    load_settings,
    mlflow_uri,
    remember_secrets,
    setting_names,
)

__all__ = ["DASHBOARD_TOKEN_ENV", "MEMORY_REDIS", "Settings", "dashboard_token", "environment", "fault_pause",
           "load_settings", "mlflow_uri", "redact", "remember_secrets", "setting_names"]
