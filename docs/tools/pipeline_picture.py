"""Draw docs/images/pipeline.png: ppdkit's pipeline from a job spec to the decoder, one box per stage.

    python docs/tools/pipeline_picture.py           # (re)draw the picture
    python docs/tools/pipeline_picture.py --check   # exit 1 when the picture is not the one the boxes below draw

The picture carries a digest of what it shows (its boxes and arrows) in a PNG text field, so `--check` compares
content, not pixels: PNG bytes differ between matplotlib versions, the boxes do not.
"""

import argparse
import hashlib
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no screen needed
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402
from PIL import Image  # noqa: E402  (matplotlib's own dependency)

OUT = Path(__file__).resolve().parents[1] / "images" / "pipeline.png"
DIGEST_KEY = "ppdkit-digest"

# (key, title, where it runs, what it writes), in pipeline order: the first row, then the second
STAGES = [
    ("spec", "job spec", "YAML + key=value\nppdkit run | submit", "typed, unknown keys refused"),
    ("data", "data", "Ray tasks", "token ids, loss masks,\nheld-out split"),
    ("teacher", "teacher", "Ray actors, frozen base\n(4-bit NF4 or float32)", "top-k next-token\ndistributions (shards)"),
    ("train", "train", "DeepSpeed ranks\non Ray Train", "prompt tokens / heads,\ncheckpoints, best -> component"),
    ("calibrate", "calibrate", "held-out acceptance", "dynamic sparse trees\n(trees.json)"),
    ("evaluate", "evaluate", "ppdkit bench", "tok/s, x ar, tokens/step,\nidentical to greedy"),
    ("register", "register", "MLflow registry", "a tagged version,\nalias challenger"),
    ("decoder", "decoder", "ppdkit decode | serve\npyfunc, models:/NAME@ALIAS", "the base model's own\ngreedy tokens, faster"),
]
PER_ROW = 4
RAY = ("data", "teacher", "train")  # the stages whose work runs on the Ray cluster
COLORS = {"spec": "#e8eef7", "decoder": "#e6f4ea", "register": "#fdf0e0"}
DEFAULT_COLOR = "#f4f4f6"
SIDE_NOTES = [  # what every stage shares, drawn under the boxes
    "every stage writes OUTPUT/<stage>/ and its summary.json last: a rerun resumes, a changed spec is refused",
    "one MLflow run per pipeline run: params, metrics by step, plots, the bench report, datasets",
    "weights, datasets and the local MLflow store live in the cache directory ($PPDKIT_CACHE), never in the repo",
]


def digest() -> str:
    """What the picture shows, as a short hash: a change to the boxes or notes makes the committed PNG stale."""
    content = json.dumps({"stages": STAGES, "per_row": PER_ROW, "ray": RAY, "notes": SIDE_NOTES})
    return hashlib.sha256(content.encode()).hexdigest()[:16]


def _box_center(index: int) -> tuple[float, float]:
    row, col = divmod(index, PER_ROW)
    return 1.6 + col * 3.2, 5.0 - row * 2.7


def draw(path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(13.5, 7.2), dpi=110)
    ax.set_xlim(0, 12.8)
    ax.set_ylim(-0.1, 6.5)
    ax.axis("off")
    # the Ray cluster: a band behind the stages that run there
    xs = [_box_center(i)[0] for i, s in enumerate(STAGES) if s[0] in RAY]
    y = _box_center(1)[1]
    ax.add_patch(FancyBboxPatch((min(xs) - 1.45, y - 1.05), max(xs) - min(xs) + 2.9, 2.25,
                                boxstyle="round,pad=0.02,rounding_size=0.15", fc="#eaf2fb", ec="#7aa6d6", ls="--"))
    ax.text(max(xs) + 1.4, y + 1.08, "Ray cluster (local or remote)", ha="right", va="top", fontsize=9,
            color="#3d6fa8", style="italic")
    for index, (key, title, where, writes) in enumerate(STAGES):
        cx, cy = _box_center(index)
        ax.add_patch(FancyBboxPatch((cx - 1.3, cy - 0.85), 2.6, 1.7, boxstyle="round,pad=0.02,rounding_size=0.12",
                                    fc=COLORS.get(key, DEFAULT_COLOR), ec="#555555", lw=1.2))
        ax.text(cx, cy + 0.55, title, ha="center", va="center", fontsize=13, weight="bold")
        ax.text(cx, cy + 0.08, where, ha="center", va="center", fontsize=8.5, color="#333333")
        ax.text(cx, cy - 0.52, writes, ha="center", va="center", fontsize=8, color="#6b4c00")
    for index in range(len(STAGES) - 1):
        (x0, y0), (x1, y1) = _box_center(index), _box_center(index + 1)
        if y0 == y1:
            start, end, style = (x0 + 1.32, y0), (x1 - 1.32, y1), "arc3"
        else:  # the end of a row to the start of the next
            start, end, style = (x0, y0 - 0.87), (x1, y1 + 0.87), "arc3,rad=-0.08"
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=16, lw=1.4, color="#444444",
                                     connectionstyle=style))
    for i, note in enumerate(SIDE_NOTES):
        ax.text(0.25, 0.95 - i * 0.42, "- " + note, ha="left", va="center", fontsize=9, color="#333333")
    ax.set_title("ppdkit: from a job spec to a faster, lossless decoder", fontsize=14, loc="left")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, bbox_inches="tight", metadata={DIGEST_KEY: digest()})
    plt.close(fig)
    return path


def is_current(path: Path) -> bool:
    if not path.exists():
        return False
    with Image.open(path) as image:
        return image.info.get(DIGEST_KEY) == digest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the committed picture is out of date")
    args = parser.parse_args(argv)
    if args.check:
        if is_current(OUT):
            return 0
        print(f"docs/images/{OUT.name} is out of date: run python docs/tools/pipeline_picture.py", file=sys.stderr)
        return 1
    print(draw(OUT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
