"""The stand-in's `torchvision.transforms` (see torchvision/__init__.py): InterpolationMode and `functional`."""

from torchvision._standin import missing
from torchvision.transforms import functional
from torchvision.transforms.functional import InterpolationMode

__all__ = ["InterpolationMode", "functional"]


def __getattr__(name: str):
    raise missing("torchvision.transforms", name)
