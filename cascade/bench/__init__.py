"""Benchmarks: each prints a table and JSON (gateway, laya, clef, load)."""
