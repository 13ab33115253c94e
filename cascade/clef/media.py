"""Images for Clef: decode the gateway's checked bytes and run the release's image processor.

The reference splices ``<|vision_start|><|image_pad|><|vision_end|>`` per image plus ``"\\n"``
after ``STATE:\\n``, with ``<|image_pad|>`` expanded to one token per merged patch, and marks
those pad tokens with ``mm_token_type_ids = 1`` (spec §1.5). We do the same with the PIL/numpy
``Qwen2VLImageProcessorPil`` built from the release's ``preprocessor_config.json``, so serving
needs no torchvision. (The hosted processor resizes through torchvision; pixel values differ
from the PIL path by up to ~0.014, which is the only expected source of deviation.)
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cascade.calls import Image
from cascade.errors import PayloadTooLarge, ValidationFailed
from cascade.schema import LIMITS

IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
# preprocessor_config.json keys the PIL processor understands; others (class names) are dropped.
PROCESSOR_KEYS = ("size", "min_pixels", "max_pixels", "patch_size", "temporal_patch_size",
                  "merge_size", "image_mean", "image_std", "do_rescale", "rescale_factor",
                  "do_normalize", "do_convert_rgb", "do_resize", "resample")


@dataclass(frozen=True)
class MediaInputs:
    """Placeholder ids to splice after ``STATE:\\n`` and the tensors the vision tower reads."""

    input_ids: list[int]
    mm_token_type_ids: list[int]
    pixel_values: Any  # torch.Tensor [patches, C * T * P * P]
    image_grid_thw: Any  # torch.Tensor [images, 3]


class ImageEncoder:
    """Turns ``Image`` lists into ``MediaInputs``; ``count`` sizes them without decoding."""

    def __init__(self, path: Path, tokenize: Callable[[str], list[int]], image_token_id: int):
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
            Qwen2VLImageProcessorPil,
        )

        config = json.loads((path / "preprocessor_config.json").read_text())
        self.processor = Qwen2VLImageProcessorPil(
            **{k: v for k, v in config.items() if k in PROCESSOR_KEYS}
        )
        self.tokenize = tokenize
        self.image_token_id = image_token_id
        self.merge = int(self.processor.merge_size)
        # Everything around the pads: per image start+end, then one newline.
        self._frame = {n: len(tokenize(IMAGE_PLACEHOLDER.replace(IMAGE_PAD, "") * n + "\n"))
                       for n in range(1, LIMITS.max_images + 1)}

    def tokens_per_image(self, image: Image) -> int:
        patches = self.processor.get_number_of_image_patches(image.height, image.width, {})
        return int(patches) // self.merge**2

    def count(self, images: Sequence[Image]) -> int:
        """Tokens the placeholders of ``images`` expand to (0 without images)."""
        if not images:
            return 0
        frame = self._frame.get(len(images))
        if frame is None:
            frame = len(self.tokenize(IMAGE_PLACEHOLDER.replace(IMAGE_PAD, "") * len(images)
                                      + "\n"))
        return frame + sum(self.tokens_per_image(image) for image in images)

    def encode(self, images: Sequence[Image]) -> MediaInputs | None:
        if not images:
            return None
        features = self.processor([_open(image) for image in images], return_tensors="pt")
        grid = features["image_grid_thw"]
        text = "".join(
            IMAGE_PLACEHOLDER.replace(IMAGE_PAD, IMAGE_PAD * (int(thw.prod()) // self.merge**2))
            for thw in grid
        ) + "\n"
        ids = self.tokenize(text)
        types = [1 if i == self.image_token_id else 0 for i in ids]
        return MediaInputs(input_ids=ids, mm_token_type_ids=types,
                           pixel_values=features["pixel_values"], image_grid_thw=grid)


def _open(image: Image) -> Any:
    """Decode one image, re-checking what the gateway promised (bombs cost a header read)."""
    from PIL import Image as PILImage
    from PIL import UnidentifiedImageError

    try:
        pil = PILImage.open(io.BytesIO(image.data), formats=("PNG", "JPEG", "WEBP"))
    except (UnidentifiedImageError, OSError) as exc:
        raise ValidationFailed.at(["images"], f"unreadable image: {exc}") from exc
    if pil.width * pil.height > LIMITS.max_image_pixels:
        raise PayloadTooLarge(
            f"image of {pil.width}x{pil.height} pixels exceeds {LIMITS.max_image_pixels}"
        )
    if (pil.width, pil.height) != (image.width, image.height):
        raise ValidationFailed.at(["images"], "image size does not match its header")
    return pil.convert("RGB")
