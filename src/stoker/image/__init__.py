"""The fast image path: crop boxes drawn like torchvision's ``RandomResizedCrop``, and JPEG
decode at reduced scale with crop, resize and flip fused, written straight into a batch."""

from stoker.image.crops import random_resized_crop_box
from stoker.image.decode import decode_box_into, decode_crop_into
from stoker.image.gpu_decode import DecodeImages

__all__ = ["DecodeImages", "decode_box_into", "decode_crop_into", "random_resized_crop_box"]
