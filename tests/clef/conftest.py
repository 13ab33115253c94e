"""Fixtures for the Clef tier: a tiny release built by our own code, and the reference oracle.

The oracle is Cloudflare's unmodified ``joint_schema_model.py`` as shipped in
``clef-finetune==0.1.0`` (imported here only). Its ``load_release_model`` asks
``AutoProcessor`` for the Qwen3-VL processor, which needs torchvision; torch 2.13 has none
that imports, so the reference gets ``StandInProcessor`` instead: the release's tokenizer plus
transformers' PIL image processor, expanding ``<|image_pad|>`` the way ``Qwen3VLProcessor``
does. Text-only logits are bit-identical to the real processor's (spec §7 (b)).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

torch.set_num_threads(1)

IMAGE_PAD = "<|image_pad|>"


class StandInProcessor:
    """What ``joint_schema_model`` needs of a processor: ``tokenizer`` and ``__call__``."""

    def __init__(self, path: Path) -> None:
        from transformers import AutoTokenizer
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
            Qwen2VLImageProcessorPil,
        )

        self.tokenizer = AutoTokenizer.from_pretrained(path)
        config = json.loads((path / "preprocessor_config.json").read_text())
        keep = (
            "size",
            "patch_size",
            "temporal_patch_size",
            "merge_size",
            "image_mean",
            "image_std",
            "do_rescale",
            "rescale_factor",
            "do_normalize",
            "resample",
        )
        self.image_processor = Qwen2VLImageProcessorPil(**{k: config[k] for k in keep})
        self.image_token_id = self.tokenizer.convert_tokens_to_ids(IMAGE_PAD)

    def __call__(
        self, text: list[str], images: Any = None, videos: Any = None, return_tensors: str = "pt"
    ) -> dict[str, Any]:
        assert videos is None
        features = self.image_processor([img.convert("RGB") for img in images], return_tensors="pt")
        merge = self.image_processor.merge_size**2
        pieces = text[0].split(IMAGE_PAD)
        expanded = pieces[0]
        for thw, rest in zip(features["image_grid_thw"], pieces[1:], strict=True):
            expanded += IMAGE_PAD * (int(thw.prod()) // merge) + rest
        ids = self.tokenizer([expanded], return_tensors="pt").input_ids
        return {
            "input_ids": ids,
            "mm_token_type_ids": (ids == self.image_token_id).long(),
            "pixel_values": features["pixel_values"],
            "image_grid_thw": features["image_grid_thw"],
        }


@pytest.fixture(scope="session")
def tiny_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from cascade.clef.tiny import make_tiny

    return make_tiny(tmp_path_factory.mktemp("clef") / "tiny", seed=0)


@pytest.fixture(scope="session")
def reference(tiny_release: Path) -> Any:
    """``(module, model, processor)`` from the reference's own loader, in fp32 on the CPU."""
    from clef_finetune._vendor import joint_schema_model as jsm

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            "transformers.AutoProcessor.from_pretrained",
            lambda path, **_: StandInProcessor(Path(path)),
        )
        model, processor = jsm.load_release_model(tiny_release, device="cpu", dtype=torch.float32)
    return jsm, model, processor


@pytest.fixture(scope="session")
def loaded(tiny_release: Path) -> Any:
    from cascade.clef import release

    return release.load(release.resolve_release(tiny_release), device="cpu")
