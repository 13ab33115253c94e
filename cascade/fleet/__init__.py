"""Replicas acting as one fleet: reloads, who serves what, and the live gate's shared state."""
