"""The stand-in's `torchvision.transforms.v2.functional` (see torchvision/__init__.py): imported as a module by
transformers' image processors, used only when an image is processed; every name is an AttributeError."""

from torchvision._standin import missing


def __getattr__(name: str):
    raise missing("torchvision.transforms.v2.functional", name)
