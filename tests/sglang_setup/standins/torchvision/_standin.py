"""The distribution this stand-in installs as (tests/sglang_setup/venv.py reads DIST and VERSION), and the two
ways its names refuse work: a function that raises when called, an attribute that does not exist."""

DIST = "torchvision"  # the real name, so that pip counts timm's `torchvision` requirement as met
VERSION = "0.0.0+specgate.standin"
WHAT = "this torchvision is specgate's import stand-in (tests/sglang_setup/standins/torchvision)"


def unavailable(qualname: str):
    """A function named `qualname` that raises NotImplementedError when called: importable, never computes."""

    def standin(*args, **kwargs):
        raise NotImplementedError(f"{qualname} was called, but {WHAT}: it has no image or video operations")

    standin.__name__ = standin.__qualname__ = qualname.rsplit(".", 1)[-1]
    return standin


def missing(module: str, name: str) -> AttributeError:
    """The error for any other attribute of a stand-in module."""
    return AttributeError(f"{module}.{name}: {WHAT}; it has no such name")
