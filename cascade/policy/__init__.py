"""Policies: the model policies/*.toml decode into, reading and checking files, pure routing
decisions, the circuit breaker and shadow sampling."""
