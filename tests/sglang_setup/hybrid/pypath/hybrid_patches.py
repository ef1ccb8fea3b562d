"""Run-time patches that let SGLang serve a tiny Qwen3-Next with DFLASH + extra_buffer on CPU (test setup only).

Written against SGLang 0.5.23 (each textual rewrite fails loudly where the source differs); see
docs/gate-sglang.md, "The #37817 path on CPU". The product never imports this.

Nothing under .venv-sglang is edited: a meta-path hook applies each patch right after its module is first
imported, in every process (sitecustomize.py installs it in spawned children, via PYTHONPATH).
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import inspect
import os
import sys
import textwrap


def log(msg: str) -> None:
    line = f"[hybrid pid={os.getpid()}] {msg}"
    print(line, file=sys.stderr, flush=True)


def rewrite_function(module, name: str, replacements: list[tuple[str, str]]) -> None:
    """Re-define module.name from its source with textual replacements (each must match)."""
    fn = getattr(module, name)
    src = textwrap.dedent(inspect.getsource(fn))
    for old, new in replacements:
        if old not in src:
            raise RuntimeError(f"hybrid patch: {old!r} not found in {module.__name__}.{name}")
        src = src.replace(old, new)
    code = compile(src, f"<hybrid patch of {module.__name__}.{name}>", "exec")
    exec(code, module.__dict__)
    log(f"patched {module.__name__}.{name}")


def rewrite_method(module, cls_name: str, name: str, replacements: list[tuple[str, str]]) -> None:
    """Re-define module.cls_name.name from its source with textual replacements (each must match)."""
    cls = getattr(module, cls_name)
    fn = cls.__dict__[name]
    src = textwrap.dedent(inspect.getsource(fn))
    for old, new in replacements:
        if old not in src:
            raise RuntimeError(f"hybrid patch: {old!r} not found in {cls_name}.{name}")
        src = src.replace(old, new)
    ns: dict = {}
    exec(compile(src, f"<hybrid patch of {module.__name__}.{cls_name}.{name}>", "exec"), module.__dict__, ns)
    new_fn = ns[name]
    new_fn.__qualname__ = f"{cls_name}.{name}"
    setattr(cls, name, new_fn)
    log(f"patched {module.__name__}.{cls_name}.{name}")


# ---- the patches, by module -------------------------------------------------------------------------

def patch_choices(m):
    # DFLASH's draft worker accepts only a list of GPU draft backends; add torch_native (the CPU one)
    if "torch_native" not in m.DRAFT_ATTENTION_BACKEND_CHOICES:
        m.DRAFT_ATTENTION_BACKEND_CHOICES.append("torch_native")
        log("DRAFT_ATTENTION_BACKEND_CHOICES += torch_native")


def patch_mamba_hook(m):
    # (3b) "extra_buffer requires platform support for Mamba cache state snapshots"
    m._platform_supports_mamba_cache_extra_buffer = lambda: True
    log("patched mamba_hook._platform_supports_mamba_cache_extra_buffer -> True")


def patch_speculative_hook(m):
    # (3a) "DFLASH speculative decoding is not supported by CpuSRTPlatform on device 'cpu'"
    rewrite_function(m, "_handle_dflash", [('cfg.device.startswith("cuda") or', 'True or ')])


PATCHES = {
    "sglang.srt.arg_groups.choices": patch_choices,
    "sglang.srt.arg_groups.mamba_hook": patch_mamba_hook,
    "sglang.srt.arg_groups.speculative_hook": patch_speculative_hook,
}
try:  # extra patches found while iterating
    from hybrid_patches_more import MORE_PATCHES  # noqa: E402
    PATCHES.update(MORE_PATCHES)
except ImportError as e:
    if "hybrid_patches_more" not in str(e):
        raise


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner, name):
        self.inner, self.name = inner, name

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        PATCHES[self.name](module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in PATCHES:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None:
                spec.loader = _PatchingLoader(spec.loader, fullname)
                return spec
        return None


def install() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
        for name in list(PATCHES):
            if name in sys.modules:
                PATCHES[name](sys.modules[name])
