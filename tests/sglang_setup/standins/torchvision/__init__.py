"""A STAND-IN for `torchvision`, for specgate's test setup only: importable, declares a version, computes nothing.

Why it exists: the registry's torchvision is a CUDA-linked build that fails to load beside the CPU torch
(`operator torchvision::nms does not exist`), yet both SGLang and transformers import it on start-up when it
is installed, even to serve a text model: SGLang's vision configs (sglang/srt/configs/deepseek_ocr.py:
`from torchvision.transforms import InterpolationMode, functional`) and transformers' image and video
utilities, which every model config imports (transformers/image_utils.py: `from torchvision.io import
ImageReadMode, decode_image`, `from torchvision.transforms.functional import pil_to_tensor`; `torchvision.io`,
`torchvision.transforms.v2.functional`). Its dist-info (version 0.0.0+specgate.standin) also meets timm's
`torchvision` requirement, so pip does not fetch the CUDA build (shared/reference/sglang-cpu.md).

What it holds: exactly the names those imports ask for. Enums (`InterpolationMode`, `ImageReadMode`) are
plain constants, as in torchvision; the imported functions raise NotImplementedError when called; any other
attribute is an AttributeError naming this stand-in. Image and video code fails at once; text serving never
calls it. `make sglang` installs it into .venv-sglang (tests/sglang_setup/venv.py); specgate's own packages
never import it (tests/sglang_setup/test_standins.py checks that).
"""

from torchvision._standin import VERSION, missing

__version__ = VERSION


def __getattr__(name: str):
    raise missing("torchvision", name)
