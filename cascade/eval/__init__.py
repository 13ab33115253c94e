"""Evaluation, calibration and the decision log: measure the cascade and fit its thresholds."""
