"""torchvision's folder datasets under the same names: ``from torchvision import datasets`` ->
``from stoker.vision import datasets``. ``ImageFolder`` hands a fused ``Compose`` the file's
path, so a JPEG is decoded only as far as its first crop or resize needs."""

from stoker.vision.datasets.folder import (
    IMG_EXTENSIONS,
    DatasetFolder,
    ImageFolder,
    default_loader,
    find_classes,
    has_file_allowed_extension,
    make_dataset,
)

__all__ = [
    "IMG_EXTENSIONS",
    "DatasetFolder",
    "ImageFolder",
    "default_loader",
    "find_classes",
    "has_file_allowed_extension",
    "make_dataset",
]
