"""The stand-in's `torchvision.transforms.v2` (see torchvision/__init__.py): only `functional`."""

from torchvision._standin import missing
from torchvision.transforms.v2 import functional

__all__ = ["functional"]


def __getattr__(name: str):
    raise missing("torchvision.transforms.v2", name)
