"""Canary rollouts of a candidate policy: the split, the verdict, the state a fleet shares."""
