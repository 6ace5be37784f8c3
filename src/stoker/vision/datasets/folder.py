"""``DatasetFolder`` and ``ImageFolder``: torchvision's (0.2x) folder datasets, same
signatures, attributes, sample order and errors.

One addition: when the loader is ``default_loader`` and the transform is a
``stoker.vision.transforms.Compose`` with a fused plan, ``__getitem__`` hands the transform the
file's path instead of a decoded image, so it decodes only the crop it keeps (NOTE [ Fused
decode in Compose ]). Any other loader or transform gets what torchvision gives it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, cast

from torch.utils.data import Dataset

from stoker.vision._io import pil_loader
from stoker.vision.transforms import Compose

#: The file extensions ``ImageFolder`` reads, compared lower-cased: torchvision's.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
Extensions = str | tuple[str, ...]


def has_file_allowed_extension(filename: str, extensions: Extensions) -> bool:
    """Whether ``filename`` ends (lower-cased) with one of ``extensions``."""
    wanted = extensions if isinstance(extensions, str) else tuple(extensions)
    return filename.lower().endswith(wanted)


def is_image_file(filename: str) -> bool:
    """Whether ``filename`` has one of ``IMG_EXTENSIONS``."""
    return has_file_allowed_extension(filename, IMG_EXTENSIONS)


def default_loader(path: str) -> Any:
    """torchvision's ``default_loader`` (Pillow backend): the file opened, converted to RGB."""
    return pil_loader(path)


def find_classes(directory: str | os.PathLike[str]) -> tuple[list[str], dict[str, int]]:
    """The class folders of ``directory`` (sorted names) and their indices."""
    classes = sorted(entry.name for entry in os.scandir(directory) if entry.is_dir())
    if not classes:
        raise FileNotFoundError(f"Couldn't find any class folder in {directory}.")
    class_to_idx = {cls_name: i for i, cls_name in enumerate(classes)}
    return classes, class_to_idx


def make_dataset(
    directory: str | os.PathLike[str],
    class_to_idx: dict[str, int] | None = None,
    extensions: Extensions | None = None,
    is_valid_file: Callable[[str], bool] | None = None,
    allow_empty: bool = False,
) -> list[tuple[str, int]]:
    """``(path, class_index)`` of every valid file under each class folder, in torchvision's
    order (classes sorted, ``os.walk`` following links, names sorted)."""
    directory = os.path.expanduser(directory)
    if class_to_idx is None:
        _, class_to_idx = find_classes(directory)
    elif not class_to_idx:
        raise ValueError("'class_to_index' must have at least one entry to collect any samples.")
    both_none = extensions is None and is_valid_file is None
    both_something = extensions is not None and is_valid_file is not None
    if both_none or both_something:
        raise ValueError(
            "Both extensions and is_valid_file cannot be None or not None at the same time"
        )
    if extensions is not None:
        wanted = extensions

        def is_valid_file(x: str) -> bool:
            return has_file_allowed_extension(x, wanted)

    valid = cast(Callable[[str], bool], is_valid_file)
    instances = []
    available_classes = set()
    for target_class in sorted(class_to_idx.keys()):
        class_index = class_to_idx[target_class]
        target_dir = os.path.join(directory, target_class)
        if not os.path.isdir(target_dir):
            continue
        for root, _, fnames in sorted(os.walk(target_dir, followlinks=True)):
            for fname in sorted(fnames):
                path = os.path.join(root, fname)
                if valid(path):
                    instances.append((path, class_index))
                    available_classes.add(target_class)
    empty_classes = set(class_to_idx.keys()) - available_classes
    if empty_classes and not allow_empty:
        msg = f"Found no valid file for the classes {', '.join(sorted(empty_classes))}. "
        if extensions is not None:
            supported = extensions if isinstance(extensions, str) else ", ".join(extensions)
            msg += f"Supported extensions are: {supported}"
        raise FileNotFoundError(msg)
    return instances


class StandardTransform:
    """``transform`` on the input and ``target_transform`` on the target: torchvision's."""

    def __init__(
        self, transform: Callable[..., Any] | None = None,
        target_transform: Callable[..., Any] | None = None,
    ) -> None:
        self.transform = transform
        self.target_transform = target_transform

    def __call__(self, input: Any, target: Any) -> tuple[Any, Any]:
        if self.transform is not None:
            input = self.transform(input)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return input, target

    def _format_transform_repr(self, transform: Callable[..., Any], head: str) -> list[str]:
        lines = transform.__repr__().splitlines()
        return [f"{head}{lines[0]}"] + ["{}{}".format(" " * len(head), line) for line in lines[1:]]

    def __repr__(self) -> str:
        body = [self.__class__.__name__]
        if self.transform is not None:
            body += self._format_transform_repr(self.transform, "Transform: ")
        if self.target_transform is not None:
            body += self._format_transform_repr(self.target_transform, "Target transform: ")
        return "\n".join(body)


class DatasetFolder(Dataset[tuple[Any, Any]]):
    """Samples arranged ``root/class_x/xxx.ext``: ``(loader(path), class_index)`` each, through
    ``transform`` / ``target_transform``; torchvision's ``DatasetFolder``.

    Attributes: ``classes`` (sorted class folder names), ``class_to_idx``, ``samples``
    (``(path, class_index)`` tuples), ``targets``. Override ``find_classes`` /
    ``make_dataset`` to change how they are found, as with torchvision's."""

    _repr_indent = 4

    def __init__(
        self,
        root: str | os.PathLike[str],
        loader: Callable[[str], Any],
        extensions: Extensions | None = None,
        transform: Callable[..., Any] | None = None,
        target_transform: Callable[..., Any] | None = None,
        is_valid_file: Callable[[str], bool] | None = None,
        allow_empty: bool = False,
    ) -> None:
        self.root: Any = os.path.expanduser(root) if isinstance(root, str) else root
        self.transform = transform
        self.target_transform = target_transform
        has_separate = transform is not None or target_transform is not None
        self.transforms = StandardTransform(transform, target_transform) if has_separate else None
        classes, class_to_idx = self.find_classes(self.root)
        samples = self.make_dataset(
            self.root, class_to_idx=class_to_idx, extensions=extensions,
            is_valid_file=is_valid_file, allow_empty=allow_empty,
        )
        self.loader = loader
        self.extensions = extensions
        self.classes = classes
        self.class_to_idx = class_to_idx
        self.samples = samples
        self.targets = [s[1] for s in samples]

    @staticmethod
    def make_dataset(
        directory: str | os.PathLike[str],
        class_to_idx: dict[str, int],
        extensions: Extensions | None = None,
        is_valid_file: Callable[[str], bool] | None = None,
        allow_empty: bool = False,
    ) -> list[tuple[str, int]]:
        """The samples (see the module-level ``make_dataset``); ``class_to_idx`` required."""
        if class_to_idx is None:
            # make_dataset() would use the logic of find_classes(), not of this class's
            # find_classes method, which a subclass may override.
            raise ValueError("The class_to_idx parameter cannot be None.")
        return make_dataset(directory, class_to_idx, extensions=extensions,
                            is_valid_file=is_valid_file, allow_empty=allow_empty)

    def find_classes(self, directory: str | os.PathLike[str]) -> tuple[list[str], dict[str, int]]:
        """The class folders (see the module-level ``find_classes``)."""
        return find_classes(directory)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        path, target = self.samples[index]
        transform = self.transform
        if (self.loader is default_loader and isinstance(transform, Compose)
                and transform.fused_plan() is not None):
            sample: Any = transform(path)  # decodes only what it keeps
        else:
            sample = self.loader(path)
            if transform is not None:
                sample = transform(sample)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return sample, target

    def __len__(self) -> int:
        return len(self.samples)

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        head = "Dataset " + self.__class__.__name__
        body = [f"Number of datapoints: {self.__len__()}"]
        if self.root is not None:
            body.append(f"Root location: {self.root}")
        body += self.extra_repr().splitlines()
        if self.transforms is not None:
            body += [repr(self.transforms)]
        lines = [head] + [" " * self._repr_indent + line for line in body]
        return "\n".join(lines)


class ImageFolder(DatasetFolder):
    """Images arranged ``root/dog/xxx.png``, ``root/cat/123.png``: torchvision's
    ``ImageFolder`` (``IMG_EXTENSIONS`` unless ``is_valid_file``; ``imgs`` is ``samples``).
    With the default loader and a ``stoker.vision.transforms.Compose`` that starts with
    ``RandomResizedCrop`` or ``Resize``, a JPEG is decoded fused with them."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        transform: Callable[..., Any] | None = None,
        target_transform: Callable[..., Any] | None = None,
        loader: Callable[[str], Any] = default_loader,
        is_valid_file: Callable[[str], bool] | None = None,
        allow_empty: bool = False,
    ) -> None:
        super().__init__(
            root, loader, IMG_EXTENSIONS if is_valid_file is None else None,
            transform=transform, target_transform=target_transform,
            is_valid_file=is_valid_file, allow_empty=allow_empty,
        )
        self.imgs = self.samples
