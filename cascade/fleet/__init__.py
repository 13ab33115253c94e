"""Replicas acting as one fleet: reloads on file changes and on a broadcast, who serves what."""
