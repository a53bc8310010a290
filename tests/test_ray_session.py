"""The embedded Ray's settings for Ray Train: its controller's polls shortened, a user's own setting kept."""

import os

from ppdkit.jobs.ray_session import QUICK_TRAIN_POLLS, quick_train_polls


def test_ray_trains_polls_are_shortened_unless_the_user_set_them(monkeypatch):
    from ray.train.v2._internal.constants import HEALTH_CHECK_INTERVAL_S_ENV_VAR, PREEMPTION_POLL_INTERVAL_S_ENV_VAR

    # the names Ray Train reads: a renamed variable would leave the 2 s and 5 s polls silently in place
    assert set(QUICK_TRAIN_POLLS) == {HEALTH_CHECK_INTERVAL_S_ENV_VAR, PREEMPTION_POLL_INTERVAL_S_ENV_VAR}
    monkeypatch.delenv(HEALTH_CHECK_INTERVAL_S_ENV_VAR, raising=False)
    monkeypatch.setenv(PREEMPTION_POLL_INTERVAL_S_ENV_VAR, "7")
    quick_train_polls()
    assert float(os.environ[HEALTH_CHECK_INTERVAL_S_ENV_VAR]) < 2.0
    assert os.environ[PREEMPTION_POLL_INTERVAL_S_ENV_VAR] == "7"
