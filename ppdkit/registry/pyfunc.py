"""An MLflow pyfunc flavor for registered components: `mlflow.pyfunc.load_model("models:/NAME@champion")` gives a
model whose `predict` decodes prompts with the bundled runtime (and `mlflow models serve --env-manager local`
serves it from ppdkit's environment).

The model is this module as a pyfunc loader (`loader_module`: nothing pickled) and the component as its data:
MLflow calls `_load_pyfunc` with the component's directory, which `Decoder.from_pretrained` loads, checking
every file's checksum as for any other load.

predict takes a DataFrame with a `prompt` column and parameters max_tokens, method, temperature and seed (-1:
none); it returns a DataFrame of `text`, `tokens`, `method` and `tokens_per_step`, one row per prompt. Prompts
are chat turns (the base model's chat template wraps them). `load_model(uri, model_config={"device": "cuda"})`
runs it on another torch device (default: the CPU).
"""

import logging
from pathlib import Path

PARAMS = {"max_tokens": 128, "method": "auto", "temperature": 0.0, "seed": -1}


class DecoderModel:
    def __init__(self, component: str | Path, device: str = "cpu", dtype: str = "auto"):
        from ppdkit.runtime.decoder import Decoder

        self.decoder = Decoder.from_pretrained(component, device=device, dtype=dtype)

    def predict(self, model_input, params: dict | None = None):
        import pandas as pd

        settings = {**PARAMS, **(params or {})}
        rows = []
        for prompt in model_input["prompt"].tolist():  # MLflow enforced the signature: a `prompt` column of strings
            result = self.decoder.generate(str(prompt), max_new_tokens=int(settings["max_tokens"]),
                                           method=str(settings["method"]),
                                           temperature=float(settings["temperature"]),
                                           seed=None if int(settings["seed"]) < 0 else int(settings["seed"]))
            rows.append({"text": result.text, "tokens": len(result.tokens), "method": result.method,
                         "tokens_per_step": result.mean_accepted_per_step})
        return pd.DataFrame(rows, columns=["text", "tokens", "method", "tokens_per_step"])


def _load_pyfunc(data_path: str, model_config: dict | None = None) -> DecoderModel:
    """MLflow's entry (loader_module): the model of the component at `data_path`; model_config may name the
    device and the dtype (auto, float32, bfloat16, gguf, q4)."""
    unknown = sorted(set(model_config or {}) - {"device", "dtype"})
    if unknown:
        raise ValueError(f"unknown model_config key(s) {unknown}: ppdkit's pyfunc model takes 'device' and 'dtype'")
    return DecoderModel(data_path, **(model_config or {}))


def save_pyfunc(component: Path, path: Path) -> Path:
    """The MLflow model at `path` (a new directory) that decodes with `component`, which it holds a copy of."""
    import mlflow
    import pandas as pd
    from mlflow.models import infer_signature

    example = pd.DataFrame({"prompt": ["Write a haiku about the sea."]})
    output = pd.DataFrame({"text": ["..."], "tokens": [1.0], "method": ["ar"], "tokens_per_step": [1.0]})
    quiet = logging.getLogger("mlflow.pyfunc")  # its "validating the input example" line is not for our console
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        mlflow.pyfunc.save_model(path=str(path), loader_module=__name__, data_path=str(component),
                                 signature=infer_signature(example, output, params=PARAMS),
                                 input_example=(example, PARAMS),
                                 pip_requirements=["ppdkit"])  # ppdkit's own environment: --env-manager local
    finally:
        quiet.setLevel(level)
    return path
