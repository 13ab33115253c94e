"""The novelty gate's reference sets: what the cheap tier's calibration data looked like."""
