"""The Laya tier: Convai's Laya checkpoints, answered exactly as laya 0.4.15 answers.

Loading and checking a checkpoint: ``config`` (both encoder-config forms, temperature clamp),
``checkpoint`` (strict tensor inventory, F16/BF16/F32), ``tokenizer``, ``hub`` (path, hub cache,
download). The request path, torch-free: ``questions`` (validation, rendering), ``rows`` (row
assembly, collation), ``preview`` (checkpoint choice, ``script`` detection, pure pre-routing),
``decode`` (unrounded probabilities, act probability, usage; rounding, confidences and answer
shapes are ``cascade.answers``, shared by every tier). ONNX: ``graph``/``graph_ops``/
``graph_head``/``graph_band`` (the model built from numpy weights), ``export`` (cache, self-check
against ``torch_ref``), ``int8`` (the int8 export: recipe, cache key), ``flip_report`` (what
int8 changes on a user's requests; the gateway's flip gate reads it). ``tiny`` writes random
checkpoints. The engine
that serves them is ``cascade.engines.laya``; its benchmark is ``cascade.bench.laya``, its commands
``cascade.cli.export`` and ``cascade.cli.make_tiny``. This package imports only the base
(``cascade.schema``, ``errors``, ``calls``, ``questions``).
"""
