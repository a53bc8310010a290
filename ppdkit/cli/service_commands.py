"""The commands that talk to servers rather than train or decode: `ppdkit promote` (a registered version's alias),
`export` (a component in the layout another server loads), `submit` and `jobs` (a Ray cluster's job API) and `ui`
(the MLflow UI)."""

import argparse
import json
import os
import sys

from ppdkit.models.gguf_export import OUTTYPES


def cmd_promote(args: argparse.Namespace) -> int:
    from ppdkit.registry.models import client, promote

    print(promote(client(args.tracking_uri), args.name, args.version, force=args.force))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ppdkit.models.eagle3_export import export_eagle3

    source = args.model
    if source.startswith("models:/"):
        from ppdkit.registry.models import resolve

        source = resolve(source)
    if args.format == "gguf":
        from ppdkit.models.gguf_export import DRAFT_FILE, RECORD, export_gguf

        out = export_gguf(Path(source), Path(args.out), args.outtype)
        record = json.loads((out / RECORD).read_text())
        print(f"wrote {out / DRAFT_FILE} (sha256 {record['sha256'][:16]}); serve it with llama.cpp: "
              f"llama-server -m {record['base_gguf']} -md {out / DRAFT_FILE} --spec-type draft-eagle3")
        return 0
    out = export_eagle3(Path(source), Path(args.out), args.format, args.verifier)
    print(f"wrote {args.format} layout to {out}")
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    from ppdkit.jobs import submit as ray_jobs
    from ppdkit.jobs.spec import load_spec

    spec = load_spec(args.spec, args.overrides)  # a bad spec fails here, not on the cluster
    env = {k: os.environ[k] for k in ("MLFLOW_TRACKING_URI", "PPDKIT_CACHE", "RAY_AUTH_MODE") if k in os.environ}
    job_id = ray_jobs.submit(spec, args.address, args.output, args.python, env)
    print(job_id)
    if args.wait:
        print(ray_jobs.wait(args.address, job_id), file=sys.stderr)
    return 0


def cmd_jobs(args: argparse.Namespace) -> int:
    from ppdkit.jobs import submit as ray_jobs

    if args.action == "list":
        for row in ray_jobs.list_jobs(args.address):
            print(f"{row['id']:<28} {row['status']:<10} {row['name']:<16} {row['entrypoint']}")
        return 0
    if not args.job_id:
        raise ValueError(f"`ppdkit jobs {args.action}` needs a job id (see `ppdkit jobs list`)")
    if args.action == "status":
        print(ray_jobs.status(args.address, args.job_id))
    elif args.action == "logs":
        ray_jobs.logs(args.address, args.job_id, args.follow)
    elif args.action == "stop":
        print("stopped" if ray_jobs.stop(args.address, args.job_id) else "already finished")
    return 0


TRAINING_VIEW = "workflowType=machine_learning"  # the MLflow UI's "Model training" pages, by URL


def cmd_ui(args: argparse.Namespace) -> int:
    from ppdkit.registry.tracking import default_tracking_uri

    uri = args.tracking_uri or default_tracking_uri()
    # this interpreter's mlflow: `.venv/bin/ppdkit ui` works with the venv not activated (no mlflow on PATH)
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", args.host, "--port",
           str(args.port)]
    print("running:", " ".join(cmd))
    # MLflow 3's UI opens on its GenAI pages unless the browser chose otherwise: this address opens the runs
    print(f"open http://{args.host}:{args.port}/#/experiments?{TRAINING_VIEW} for the runs, their charts and "
          "the model registry", flush=True)
    os.execv(cmd[0], cmd)


# These only talk to a server: `main` skips, for them, the setup that imports torch (a second sooner)
TORCH_FREE = (cmd_submit, cmd_jobs, cmd_ui)


def add_service_commands(sub: argparse._SubParsersAction) -> None:
    """promote, export, submit, jobs and ui."""
    prom = sub.add_parser("promote", help="move the champion alias to a registered version if it is at least as good")
    prom.add_argument("name")
    prom.add_argument("version")
    prom.add_argument("--force", action="store_true", help="promote even if it is worse than the champion")
    prom.add_argument("--tracking-uri", help="default: $MLFLOW_TRACKING_URI, else the cache's sqlite store")
    prom.set_defaults(func=cmd_promote)

    export = sub.add_parser("export", help="write an eagle3 component in the layout vLLM (speculators), SGLang or "
                                           "llama.cpp (gguf) loads")
    export.add_argument("model", help="a component directory or models:/NAME@ALIAS")
    export.add_argument("--format", required=True, choices=["speculators", "sglang", "gguf"],
                        help="speculators: vLLM's draft format (speculators 0.9.0); sglang: the Hugging Face EAGLE-3 "
                             "layout (LlamaForCausalLMEagle3), which vLLM loads too; gguf: llama.cpp's EAGLE-3 draft "
                             "(llama-server -md, --spec-type draft-eagle3), written by llama.cpp's own converter")
    export.add_argument("--out", required=True, help="the directory to write (replaced if it exists)")
    export.add_argument("--verifier", help="the base model's name in the config (default: its Hub id)")
    export.add_argument("--outtype", default="auto", choices=OUTTYPES,
                        help="gguf: the draft's matrices, as llama.cpp's converter writes them (default auto: f16)")
    export.set_defaults(func=cmd_export)

    sub_job = sub.add_parser("submit", help="submit a job spec's whole pipeline to a Ray cluster as a Ray job")
    sub_job.add_argument("spec")
    sub_job.add_argument("overrides", nargs="*", metavar="key=value")
    sub_job.add_argument("--address", required=True, help="the cluster's job API, e.g. http://127.0.0.1:8265")
    sub_job.add_argument("--output", help="output directory on the cluster (default: its cache's runs/<name>)")
    sub_job.add_argument("--python", help="interpreter on the cluster (default: this one for a local head, else python)")
    sub_job.add_argument("--wait", action="store_true", help="wait for the job to end; fail with its last log lines")
    sub_job.set_defaults(func=cmd_submit)

    jobs_cmd = sub.add_parser("jobs", help="Ray jobs on a cluster: list | status ID | logs ID [--follow] | stop ID")
    jobs_cmd.add_argument("action", choices=["list", "status", "logs", "stop"])
    jobs_cmd.add_argument("job_id", nargs="?")
    jobs_cmd.add_argument("--address", default=os.environ.get("RAY_API_SERVER_ADDRESS", "http://127.0.0.1:8265"))
    jobs_cmd.add_argument("--follow", action="store_true")
    jobs_cmd.set_defaults(func=cmd_jobs)

    ui = sub.add_parser("ui", help="open the MLflow UI on the local tracking store (127.0.0.1)")
    ui.add_argument("--tracking-uri", help="default: $MLFLOW_TRACKING_URI, else the cache's sqlite store")
    ui.add_argument("--host", default="127.0.0.1")
    ui.add_argument("--port", type=int, default=5000)
    ui.set_defaults(func=cmd_ui)
