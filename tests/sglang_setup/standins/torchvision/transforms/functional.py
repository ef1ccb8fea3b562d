"""The stand-in's `torchvision.transforms.functional` (see torchvision/__init__.py): InterpolationMode, and the
imported functions, which raise."""

import enum

from torchvision._standin import missing, unavailable


class InterpolationMode(enum.Enum):
    """torchvision's interpolation names (a constant SGLang's vision configs and transformers import; it lives
    here in torchvision too, re-exported by `torchvision.transforms`)."""

    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


pil_to_tensor = unavailable("torchvision.transforms.functional.pil_to_tensor")
to_tensor = unavailable("torchvision.transforms.functional.to_tensor")


def __getattr__(name: str):
    raise missing("torchvision.transforms.functional", name)
