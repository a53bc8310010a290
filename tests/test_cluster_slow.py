"""The real way to use ppdkit: a Ray head and an MLflow server on 127.0.0.1, a submitted job, the registry."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FIXTURES, REPO, free_port

pytestmark = pytest.mark.slow


def _ppdkit(*args, env, timeout=900) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(sys.executable).with_name("ppdkit")), *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


def _head_log(env: dict) -> str:
    log = Path(env["PPDKIT_CACHE"]) / f"ray-head-{env['RAY_DASHBOARD_PORT']}" / "head.log"
    return "\n--- the head's log ---\n" + (log.read_text()[-3000:] if log.exists() else "(none)")


def test_submit_follow_register_promote_decode(tmp_path):
    bin_dir = str(Path(sys.executable).parent)
    mlflow_port, gcs_port, dash_port = free_port(), free_port(), free_port()
    # the session's own local Ray holds the agent's default ports: give this head free ones
    agent_ports = {name: str(free_port()) for name in ("RAY_AGENT_PORT", "RAY_AGENT_GRPC_PORT",
                                                         "RAY_RUNTIME_ENV_AGENT_PORT", "RAY_METRICS_PORT")}
    env = {**os.environ, **agent_ports, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PPDKIT_CACHE": str(tmp_path / "cache"),
           "RAY_GCS_PORT": str(gcs_port), "RAY_DASHBOARD_PORT": str(dash_port),
           "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{mlflow_port}", "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    address = f"http://127.0.0.1:{dash_port}"
    try:
        up = subprocess.run(["bash", str(REPO / "infra/mlflow/start-server.sh"), str(mlflow_port)], env=env,
                            capture_output=True, text=True, timeout=180)
        assert up.returncode == 0, up.stdout + up.stderr
        up = subprocess.run(["bash", str(REPO / "infra/ray/start-local-head.sh"), "2"], env=env,
                            capture_output=True, text=True, timeout=180)
        assert up.returncode == 0, up.stdout + up.stderr

        overrides = ["base_model.name=tiny-llama", f"data.source={FIXTURES / 'conversations.jsonl'}", "data.holdout=0.3",
                     "teacher.rows_per_shard=2", "train.max_steps=2", "train.micro_batch=1", "calibrate.sizes=[8,16]",
                     "calibrate.sequences=4", "evaluate.limit=2", "evaluate.max_new_tokens=8",
                     "tracking.registered_model=ppdkit-ci"]
        submitted = _ppdkit("submit", str(REPO / "ppdkit/jobs/configs/demo.yaml"), *overrides, "--address", address,
                            "--output", str(tmp_path / "run"), env=env)
        assert submitted.returncode == 0, submitted.stderr[-3000:] + _head_log(env)
        job_id = submitted.stdout.strip().splitlines()[-1]
        followed = _ppdkit("jobs", "logs", job_id, "--follow", "--address", address, env=env, timeout=1500)
        assert "stages data, teacher, train, calibrate, evaluate, register complete" in followed.stdout, \
            followed.stdout[-3000:]
        assert "compare:   http://127.0.0.1:" in followed.stdout  # the server is the UI: its own link, no `ppdkit ui`
        assert "View run" not in followed.stdout  # MLflow's own line at the run's end: the summary has the links
        assert _ppdkit("jobs", "status", job_id, "--address", address, env=env).stdout.strip() == "SUCCEEDED"
        assert job_id in _ppdkit("jobs", "list", "--address", address, env=env).stdout

        registered = json.loads((tmp_path / "run" / "register" / "summary.json").read_text())
        assert registered["name"] == "ppdkit-ci"
        promoted = _ppdkit("promote", "ppdkit-ci", str(registered["version"]), env=env)
        assert promoted.returncode == 0 and "now champion" in promoted.stdout, promoted.stderr
        decoded = _ppdkit("decode", "--model", "models:/ppdkit-ci@champion", "--prompt", "Hello there",
                          "--max-new-tokens", "8", env=env)
        assert decoded.returncode == 0, decoded.stderr[-3000:]
        assert "[ppd] 8 tokens" in decoded.stderr
        assert "Downloading artifacts" not in decoded.stderr  # MLflow's bar: not ours, off without --verbose

        # what users meet: clear errors
        missing = _ppdkit("decode", "--model", "models:/ppdkit-ci@nosuchalias", "--prompt", "x", env=env)
        assert missing.returncode == 2 and "registered models: ppdkit-ci" in missing.stderr
        nowhere = _ppdkit("jobs", "list", "--address", f"http://127.0.0.1:{free_port()}", env=env)
        assert nowhere.returncode == 2 and "no Ray job API" in nowhere.stderr
    finally:
        subprocess.run(["bash", str(REPO / "infra/ray/stop-local-head.sh")], env=env, capture_output=True, timeout=120)
        subprocess.run(["bash", str(REPO / "infra/mlflow/stop-server.sh")], env=env, capture_output=True, timeout=60)
