from pydantic import Field

from ppdkit.models.config import Section


class TrackingConfig(Section):
    enabled: bool = Field(True, description="log the run to MLflow; false: no run, and nothing is registered")
    uri: str | None = Field(None, min_length=1,
                            description="MLflow tracking URI; default $MLFLOW_TRACKING_URI, else sqlite in the cache")
    experiment: str = Field("ppdkit", min_length=1, description="MLflow experiment the run goes in (created when missing)")
    system_metrics_every: float | None = Field(10.0, gt=0, description="seconds between samples of CPU, memory, disk "
                                               "and network, logged as the run's system/ metrics (null: none)")
    registered_model: str | None = Field(None, min_length=1, description="registered model the component becomes a version of "
                                                            "(default: ppdkit-<base model name>)")
