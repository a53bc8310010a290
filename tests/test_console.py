"""What `ppdkit run` prints of its stages (ppdkit/cli/console.py): a draft that did not pay says so, and why."""

from ppdkit.cli.console import STAGE_FIGURES


def _evaluate(**ppd) -> dict:
    figures = {"hf_greedy_tokens_per_s": 50.0, "hf_greedy_speedup": 1.0, "ar_tokens_per_s": 100.0, "ar_speedup": 2.0}
    return {**figures, **{f"ppd_{k}": v for k, v in ppd.items()}}


def test_a_draft_slower_than_ar_says_in_plain_words_that_it_does_not_pay_and_why():
    lines = STAGE_FIGURES["evaluate"](_evaluate(tokens_per_s=79.0, speedup=1.58, accepted_per_step=1.37,
                                                rows_per_step=6.0))
    assert lines[0].startswith("hf_greedy 50.0 tok/s") and "ppd 79.0 tok/s (1.58x greedy, 0.79x ar)" in lines[0]
    assert lines[1].startswith("ppd does not pay here: it kept 1.37 tokens a step for 6.0 input rows")
    ran = STAGE_FIGURES["evaluate"](_evaluate(tokens_per_s=99.0, speedup=1.98, accepted_per_step=1.0,
                                              rows_per_step=1.0, ran="ar", why="its calibrated trees are predicted..."))
    assert ran[1] == "ppd ran as ar: its calibrated trees are predicted..."
    paying = STAGE_FIGURES["evaluate"](_evaluate(tokens_per_s=130.0, speedup=2.6, accepted_per_step=2.0,
                                                 rows_per_step=8.0))
    assert len(paying) == 1  # a draft that pays needs no excuse
