"""The experiment's saved runs-table view: ppdkit's key columns, one click (or one link) away.

What MLflow 3 allows here, read from its UI code: the runs table's columns come from the browser's local
storage for that experiment, and a first visit gets the built-in default (run name, created, dataset,
duration, source, models). No experiment tag or server setting changes that default. What a program can do
is save a view: an experiment tag `mlflow.sharedViewState.<id>` holding `{"name", "createdAt", "updatedAt",
"state"}`, where `state` is the page state as JSON (the columns shown, the sort). The runs page lists it in
its views menu, and `#/experiments/<id>/runs?viewStateShareKey=<id>` opens the table with it directly; the UI
then offers "Override my view", which keeps those columns as that browser's default for the experiment.
"""

import json
import time

VIEW_ID = "ppdkit-key-figures"
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_ID}"
VIEW_NAME = "ppdkit key figures"
SHARE_PARAM = "viewStateShareKey"

# the run-level figures the pipeline logs (jobs/key_figures.py), under these exact names
KEY_TAGS = ("method", "decode_method")
KEY_METRICS = ("tokens_per_step", "x_ar", "identical", "tokens_per_s")


def column(kind: str, name: str) -> str:
    """A runs-table column as the UI names it: attributes.`Dataset`, metrics.`x_ar`, tags.`method`."""
    return f"{kind}.`{name}`"


# The UI groups columns (attributes, then metrics, then tags) whatever this order. Models is left out: it lists
# MLflow's logged models, and ppdkit registers its versions from run artifacts instead, so it would stay empty.
COLUMNS = (*(column("tags", t) for t in KEY_TAGS), *(column("metrics", m) for m in KEY_METRICS),
           column("attributes", "Dataset"))


def view_tag_value(now_ms: int | None = None) -> str:
    """The tag's value: the envelope the UI's saved-view menu parses, its page state as a JSON string."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    state = {"selectedColumns": list(COLUMNS), "orderByKey": "attributes.start_time", "orderByAsc": False}
    return json.dumps({"name": VIEW_NAME, "createdAt": now_ms, "updatedAt": now_ms, "state": json.dumps(state)})


def runs_view_url(ui: str, experiment_id: str) -> str:
    """The link that opens the experiment's runs table with the key columns (`ui`: the server's address). It
    names the runs page itself: `#/experiments/<id>` alone redirects and loses the view's parameter."""
    return (f"{ui.rstrip('/')}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"
            f"&{SHARE_PARAM}={VIEW_ID}")
