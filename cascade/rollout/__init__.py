"""Canary rollouts of a candidate policy: the split, the guards' verdict, the state a fleet shares."""
