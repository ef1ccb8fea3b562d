"""The stand-in's `torchvision.io` (see torchvision/__init__.py): the names transformers imports, none usable."""

import enum

from torchvision._standin import missing, unavailable


class ImageReadMode(enum.Enum):
    """torchvision's image read modes (a constant transformers' image_utils imports)."""

    UNCHANGED = 0
    GRAY = 1
    GRAY_ALPHA = 2
    RGB = 3
    RGB_ALPHA = 4


decode_image = unavailable("torchvision.io.decode_image")
decode_jpeg = unavailable("torchvision.io.decode_jpeg")
read_video = unavailable("torchvision.io.read_video")


def __getattr__(name: str):
    raise missing("torchvision.io", name)
