"""A decoded request body becomes validated ``EngineCall``s: limits, questions, images; no HTTP."""
