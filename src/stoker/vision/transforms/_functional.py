"""The image operations behind ``stoker.vision.transforms``, with torchvision's semantics.

Each follows ``torchvision.transforms.functional`` (v1) for PIL images and tensors: the same
output sizes, rounding, padding and dtypes. PIL images go through Pillow's own operations
(``crop``, ``resize`` with antialiasing, ``transpose``), as torchvision does, so the pixels are
the same; tensors through ``torch.nn.functional.interpolate``. Pillow is imported only when an
image is one.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from stoker.vision.transforms._modes import PIL_FILTERS, InterpolationMode

_INTEGER_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def warn_as_torchvision(message: str) -> None:
    """torchvision's warnings, with its words (the one module here that warns)."""
    warnings.warn(message, UserWarning, stacklevel=3)


def is_pil_image(img: Any) -> bool:
    image_module = sys.modules.get("PIL.Image")  # not imported: nothing can be a PIL image
    return image_module is not None and isinstance(img, image_module.Image)


def _pil_only(img: Any) -> None:
    if not is_pil_image(img):
        raise TypeError(f"img should be PIL Image. Got {type(img)}")


def _tensor_image(img: torch.Tensor) -> None:
    if img.ndim < 2:
        raise TypeError("Tensor is not a torch image.")


def get_dimensions(img: Any) -> list[int]:
    """``[channels, height, width]`` of a PIL image or a ``[..., C, H, W]`` tensor."""
    if isinstance(img, torch.Tensor):
        _tensor_image(img)
        channels = 1 if img.ndim == 2 else int(img.shape[-3])
        return [channels, int(img.shape[-2]), int(img.shape[-1])]
    if is_pil_image(img):
        width, height = img.size
        return [len(img.getbands()), height, width]
    raise TypeError(f"Unexpected type {type(img)}")


def crop(img: Any, top: int, left: int, height: int, width: int) -> Any:
    """The ``height x width`` region at (``top``, ``left``); outside the image is zero."""
    if not isinstance(img, torch.Tensor):
        _pil_only(img)
        return img.crop((left, top, left + width, top + height))
    _tensor_image(img)
    _, h, w = get_dimensions(img)
    right, bottom = left + width, top + height
    if left < 0 or top < 0 or right > w or bottom > h:
        ltrb = [
            max(-left + min(0, right), 0),
            max(-top + min(0, bottom), 0),
            max(right - max(w, left), 0),
            max(bottom - max(h, top), 0),
        ]
        return _pad_zeros(img[..., max(top, 0) : bottom, max(left, 0) : right], ltrb)
    return img[..., top:bottom, left:right]


def _pad_zeros(img: Any, ltrb: list[int]) -> Any:
    """``img`` padded with zeros by (left, top, right, bottom) pixels."""
    if isinstance(img, torch.Tensor):
        squeeze = img.ndim < 4
        padded = torch.nn.functional.pad(
            img.unsqueeze(0) if squeeze else img,
            [ltrb[0], ltrb[2], ltrb[1], ltrb[3]], mode="constant", value=0.0,
        )
        return padded.squeeze(0) if squeeze else padded
    from PIL import ImageOps

    channels = len(img.getbands())
    fill: Any = 0.0 if img.mode == "F" else (tuple([0] * channels) if channels > 1 else 0)
    if img.mode == "P":
        palette = img.getpalette()
        image = ImageOps.expand(img, border=tuple(ltrb), fill=fill)
        image.putpalette(palette)
        return image
    return ImageOps.expand(img, border=tuple(ltrb), fill=fill)


def center_crop_box(
    height: int, width: int, crop_h: int, crop_w: int
) -> tuple[tuple[int, int, int, int], tuple[int, int]]:
    """torchvision's ``center_crop`` geometry: the zero padding (left, top, right, bottom) a
    crop larger than the image adds, and the crop's (top, left) in the padded image."""
    pad = (
        (crop_w - width) // 2 if crop_w > width else 0,
        (crop_h - height) // 2 if crop_h > height else 0,
        (crop_w - width + 1) // 2 if crop_w > width else 0,
        (crop_h - height + 1) // 2 if crop_h > height else 0,
    )
    height, width = height + pad[1] + pad[3], width + pad[0] + pad[2]
    return pad, (int(round((height - crop_h) / 2.0)), int(round((width - crop_w) / 2.0)))


def center_crop(img: Any, output_size: Sequence[int] | int) -> Any:
    if isinstance(output_size, (int, float)):
        size = (int(output_size), int(output_size))
    elif len(output_size) == 1:
        size = (output_size[0], output_size[0])
    else:
        size = (output_size[0], output_size[1])
    _, height, width = get_dimensions(img)
    pad, (top, left) = center_crop_box(height, width, size[0], size[1])
    if any(pad):
        img = _pad_zeros(img, list(pad))
        _, height, width = get_dimensions(img)
        if (height, width) == size:
            return img
    return crop(img, top, left, size[0], size[1])


def resized_output_size(
    height: int, width: int, size: Sequence[int], max_size: int | None = None
) -> list[int]:
    """``[new_h, new_w]`` of ``Resize``: ``size`` of two is (h, w); of one, the shorter side
    (the longer scaled as ``int(size * long / short)``), then capped at ``max_size``."""
    if len(size) != 1:
        return [size[0], size[1]]
    short, long = (width, height) if width <= height else (height, width)
    new_short = requested = size[0]
    new_long = int(requested * long / short)
    if max_size is not None:
        if max_size <= requested:
            raise ValueError(
                f"max_size = {max_size} must be strictly greater than the requested "
                f"size for the smaller edge size = {list(size)}"
            )
        if new_long > max_size:
            new_short, new_long = int(max_size * new_short / new_long), max_size
    new_w, new_h = (new_short, new_long) if width <= height else (new_long, new_short)
    return [new_h, new_w]


def resize_size_list(size: Sequence[int] | int, max_size: int | None) -> list[int]:
    """``size`` as torchvision's ``resize`` takes it, checked as it checks it."""
    if isinstance(size, int):
        return [size]
    if len(size) not in (1, 2):
        raise ValueError(
            f"Size must be an int or a 1 or 2 element tuple/list, not a {len(size)} element "
            "tuple/list"
        )
    if max_size is not None and len(size) != 1:
        raise ValueError(
            "max_size should only be passed if size specifies the length of the smaller "
            "edge, i.e. size should be an int or a sequence of length 1 in torchscript mode."
        )
    return list(size)


def resize(
    img: Any,
    size: Sequence[int] | int,
    interpolation: InterpolationMode = InterpolationMode.BILINEAR,
    max_size: int | None = None,
    antialias: bool | None = True,
) -> Any:
    """torchvision's ``resize``: the same image back when the size does not change."""
    sizes = resize_size_list(size, max_size)
    _, height, width = get_dimensions(img)
    output = resized_output_size(height, width, sizes, max_size)
    if [height, width] == output:
        return img
    if not isinstance(img, torch.Tensor):
        if antialias is False:
            warn_as_torchvision(
                "Anti-alias option is always applied for PIL Image input. Argument antialias "
                "is ignored."
            )
        return img.resize((output[1], output[0]), PIL_FILTERS[interpolation])
    return _resize_tensor(img, output, interpolation.value, antialias)


def _resize_tensor(
    img: torch.Tensor, size: list[int], mode: str, antialias: bool | None
) -> torch.Tensor:
    _tensor_image(img)
    smooth = mode in ("bilinear", "bicubic")
    squeeze = img.ndim < 4
    batch = img.unsqueeze(0) if squeeze else img
    out_dtype = batch.dtype
    cast = out_dtype not in (torch.float32, torch.float64)
    if cast:
        batch = batch.to(torch.float32)
    batch = torch.nn.functional.interpolate(
        batch, size=size, mode=mode, align_corners=False if smooth else None,
        antialias=bool(antialias) and smooth,
    )
    if mode == "bicubic" and out_dtype == torch.uint8:
        batch = batch.clamp(min=0, max=255)
    if squeeze:
        batch = batch.squeeze(0)
    if cast:
        if out_dtype in _INTEGER_DTYPES:
            batch = torch.round(batch)  # better to round before the cast
        batch = batch.to(out_dtype)
    return batch


def hflip(img: Any) -> Any:
    if isinstance(img, torch.Tensor):
        _tensor_image(img)
        return img.flip(-1)
    _pil_only(img)
    from PIL import Image

    return img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)


def to_tensor(pic: Any) -> torch.Tensor:
    """``ToTensor``: HWC in [0, 255] to CHW float in [0, 1] (uint8 data), others unscaled."""
    is_array = isinstance(pic, np.ndarray)
    if not (is_pil_image(pic) or is_array):
        raise TypeError(f"pic should be PIL Image or ndarray. Got {type(pic)}")
    float_dtype = torch.get_default_dtype()
    if is_array:
        if pic.ndim not in (2, 3):
            raise ValueError(f"pic should be 2/3 dimensional. Got {pic.ndim} dimensions.")
        if pic.ndim == 2:
            pic = pic[:, :, None]
        img = torch.from_numpy(pic.transpose((2, 0, 1))).contiguous()
        return img.to(dtype=float_dtype).div(255) if img.dtype == torch.uint8 else img
    nptype = {"I": np.int32, _i16(): np.int16, "F": np.float32}.get(pic.mode, np.uint8)
    img = torch.from_numpy(np.array(pic, nptype, copy=True))
    if pic.mode == "1":
        img = 255 * img
    img = img.view(pic.size[1], pic.size[0], len(pic.getbands()))
    img = img.permute((2, 0, 1)).contiguous()  # HWC to CHW
    return img.to(dtype=float_dtype).div(255) if img.dtype == torch.uint8 else img


def _i16() -> str:
    return "I;16" if sys.byteorder == "little" else "I;16B"


def pil_to_tensor(pic: Any) -> torch.Tensor:
    """``PILToTensor``: the image's own dtype, CHW (a permuted view of the HWC copy)."""
    if not is_pil_image(pic):
        raise TypeError(f"pic should be PIL Image. Got {type(pic)}")
    img = torch.as_tensor(np.array(pic, copy=True))
    img = img.view(pic.size[1], pic.size[0], len(pic.getbands()))
    return img.permute((2, 0, 1))


def _max_value(dtype: torch.dtype) -> int:
    if dtype.is_floating_point or dtype == torch.bool:
        return 1
    return int(torch.iinfo(dtype).max)


def convert_image_dtype(image: torch.Tensor, dtype: torch.dtype = torch.float) -> torch.Tensor:
    """``ConvertImageDtype``: the value range rescaled to ``dtype``'s, as torchvision does."""
    if not isinstance(image, torch.Tensor):
        raise TypeError("Input img should be Tensor Image")
    if image.dtype == dtype:
        return image
    if image.is_floating_point():
        if dtype.is_floating_point:
            return image.to(dtype)
        if (image.dtype == torch.float32 and dtype in (torch.int32, torch.int64)) or (
            image.dtype == torch.float64 and dtype == torch.int64
        ):
            raise RuntimeError(
                f"The cast from {image.dtype} to {dtype} cannot be performed safely."
            )
        eps = 1e-3  # max + 1 - eps: an even mapping of [0, 1] onto the integers
        return image.mul(float(_max_value(dtype)) + 1.0 - eps).to(dtype)
    input_max = float(_max_value(image.dtype))
    if dtype.is_floating_point:
        return image.to(dtype) / input_max
    output_max = float(_max_value(dtype))
    if input_max > output_max:
        factor = int((input_max + 1) // (output_max + 1))
        return torch.div(image, factor, rounding_mode="floor").to(dtype)
    factor = int((output_max + 1) // (input_max + 1))
    return image.to(dtype) * factor


def normalize(
    tensor: torch.Tensor, mean: Sequence[float], std: Sequence[float], inplace: bool = False
) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"img should be Tensor Image. Got {type(tensor)}")
    _tensor_image(tensor)
    if not tensor.is_floating_point():
        raise TypeError(f"Input tensor should be a float tensor. Got {tensor.dtype}.")
    if tensor.ndim < 3:
        raise ValueError(
            "Expected tensor to be a tensor image of size (..., C, H, W). Got tensor.size() = "
            f"{tensor.size()}"
        )
    if not inplace:
        tensor = tensor.clone()
    mean_t = torch.as_tensor(mean, dtype=tensor.dtype, device=tensor.device)
    std_t = torch.as_tensor(std, dtype=tensor.dtype, device=tensor.device)
    if (std_t == 0).any():
        raise ValueError(
            f"std evaluated to zero after conversion to {tensor.dtype}, leading to division by "
            "zero."
        )
    if mean_t.ndim == 1:
        mean_t = mean_t.view(-1, 1, 1)
    if std_t.ndim == 1:
        std_t = std_t.view(-1, 1, 1)
    return tensor.sub_(mean_t).div_(std_t)
