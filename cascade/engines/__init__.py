"""The tiers behind one small protocol (``base``): Laya on ONNX, Clef in process, any
/v1/systemone upstream over HTTP, and a fake for tests; ``batcher`` feeds one model thread."""
