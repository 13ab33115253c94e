"""Images for Clef: decode the gateway's checked bytes and run the release's image processor.

The reference splices ``<|vision_start|><|image_pad|><|vision_end|>`` per image plus ``"\\n"``
after ``STATE:\\n``, with ``<|image_pad|>`` expanded to one token per merged patch, and marks
those pad tokens with ``mm_token_type_ids = 1`` (spec §1.5). We do the same with the PIL/numpy
``Qwen2VLImageProcessorPil`` built from the release's ``preprocessor_config.json``, so serving
needs no torchvision. (The hosted processor resizes through torchvision; pixel values differ
from the PIL path by up to ~0.014, which is the only expected source of deviation.)

What a request's images may cost: the gateway checked them without decoding (header, pixels,
a JPEG's scan count: ``cascade.request.images``), so this is each image's only decode, and data
corrupt inside the compressed stream is refused here (422 naming the image). Each is decoded at
full size one at a time, at most ``DECODE_SLOTS`` at once across threads, and resized straight
away to the size the processor would resize it to (the same PIL call, so the pixels are the
same): a 16 MP image holds 48 MB (64 MB decoding RGBA) only while it is being resized, never
beside its siblings. An image the processor refuses (an aspect ratio over 200) is the client's:
``ValidationFailed`` (422) naming the image, never a failure of the tier.
"""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cascade.calls import Image
from cascade.errors import PayloadTooLarge, ValidationFailed
from cascade.schema import LIMITS

IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
# preprocessor_config.json keys the PIL processor understands; others (class names) are dropped.
PROCESSOR_KEYS = (
    "size",
    "min_pixels",
    "max_pixels",
    "patch_size",
    "temporal_patch_size",
    "merge_size",
    "image_mean",
    "image_std",
    "do_rescale",
    "rescale_factor",
    "do_normalize",
    "do_convert_rgb",
    "do_resize",
    "resample",
)
DECODE_SLOTS = 2  # full-size image decodes at once, per engine


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
        self._decoding = threading.BoundedSemaphore(DECODE_SLOTS)
        # Everything around the pads: per image start+end, then one newline.
        self._frame = {
            n: len(tokenize(IMAGE_PLACEHOLDER.replace(IMAGE_PAD, "") * n + "\n"))
            for n in range(1, LIMITS.max_images + 1)
        }

    def tokens_per_image(self, image: Image, index: int = 0) -> int:
        with _refused(index):
            patches = self.processor.get_number_of_image_patches(image.height, image.width, {})
        return int(patches) // self.merge**2

    def count(self, images: Sequence[Image]) -> int:
        """Tokens the placeholders of ``images`` expand to (0 without images)."""
        if not images:
            return 0
        frame = self._frame.get(len(images))
        if frame is None:
            frame = len(
                self.tokenize(IMAGE_PLACEHOLDER.replace(IMAGE_PAD, "") * len(images) + "\n")
            )
        return frame + sum(self.tokens_per_image(image, i) for i, image in enumerate(images))

    def encode(self, images: Sequence[Image]) -> MediaInputs | None:
        if not images:
            return None
        for i, image in enumerate(images):
            self.tokens_per_image(image, i)  # the processor's own checks, image by image
        pixels = [self._load(image, i) for i, image in enumerate(images)]
        with _refused(None):
            features = self.processor(pixels, return_tensors="pt")
        grid = features["image_grid_thw"]
        text = (
            "".join(
                IMAGE_PLACEHOLDER.replace(IMAGE_PAD, IMAGE_PAD * (int(thw.prod()) // self.merge**2))
                for thw in grid
            )
            + "\n"
        )
        ids = self.tokenize(text)
        types = [1 if i == self.image_token_id else 0 for i in ids]
        return MediaInputs(
            input_ids=ids,
            mm_token_type_ids=types,
            pixel_values=features["pixel_values"],
            image_grid_thw=grid,
        )

    def _load(self, image: Image, index: int) -> Any:
        """``image`` decoded as RGB at the size the processor will resize it to, when smaller."""
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

        size = self.processor.size
        with self._decoding, _refused(index):
            pil = _open(image, index)
            height, width = smart_resize(
                pil.height,
                pil.width,
                factor=self.processor.patch_size * self.merge,
                min_pixels=size["shortest_edge"],
                max_pixels=size["longest_edge"],
            )
            if height * width < pil.height * pil.width:
                # What the processor does to it (PIL, same filter), done before it holds a
                # full-size array: resizing to the size it already has leaves the pixels alone.
                pil = pil.resize((width, height), resample=self.processor.resample)
            return pil


@contextmanager
def _refused(index: int | None) -> Iterator[None]:
    """The image processor's ``ValueError`` about a request's image, as the client's 422."""
    try:
        yield
    except ValueError as exc:
        loc: list[str | int] = ["images"] if index is None else ["images", index]
        raise ValidationFailed.at(
            loc, f"the Clef image processor refused the image: {exc}", "image_refused"
        ) from exc


def _open(image: Image, index: int) -> Any:
    """Decode one image as RGB, re-checking what the gateway promised (bombs cost a header
    read); undecodable data is ``ValidationFailed`` at the image."""
    from PIL import Image as PILImage
    from PIL import UnidentifiedImageError

    loc: list[str | int] = ["images", index]
    try:
        pil = PILImage.open(io.BytesIO(image.data), formats=("PNG", "JPEG", "WEBP"))
        if pil.width * pil.height > LIMITS.max_image_pixels:
            raise PayloadTooLarge(
                f"image {index} of {pil.width}x{pil.height} pixels exceeds "
                f"{LIMITS.max_image_pixels}"
            )
        if (pil.width, pil.height) != (image.width, image.height):
            raise ValidationFailed.at(loc, "image size does not match its header")
        pil.load()
        return pil if pil.mode == "RGB" else pil.convert("RGB")  # convert() always copies
    except (UnidentifiedImageError, OSError, SyntaxError) as exc:
        raise ValidationFailed.at(loc, f"unreadable image: {exc}") from exc
