"""OpenTelemetry traces of every hop (off unless configured); timing and cost headers."""
