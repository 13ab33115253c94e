"""Clef-flash, cascade's GPU tier: Cloudflare's Qwen3.5 backbone with a joint schema head.

- ``release``: locate (local path or hub cache, offline), load and verify a release.
- ``prompt``: the reference's piecewise prompt, exact spans, the over-long policy.
- ``media``: images through the release's image processor (no torchvision needed).
- ``head`` + ``layout``: our joint schema head, batched over right-padded rows.
- ``runner``: the synchronous batch runner the engine's micro-batcher drives.
- ``tiny``: tiny random releases for tests and demos.

The engine itself is ``cascade.engines.clef.ClefEngine``; the benchmark ``cascade.bench.clef``.
This package imports only the base (``cascade.schema``, ``errors``, ``calls``). Nothing here
imports torch at module level except ``head`` and ``layout``.
"""
