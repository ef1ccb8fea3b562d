"""The import hook that applies the installed SGLang release's patch set (patchset.py) to its modules' source.

Installed in every process SGLang starts (sitecustomize.py, with SPECGATE_HYBRID_PATCH=1 and this directory on
PYTHONPATH): the server, its scheduler and its detokenizer. Each patched module is compiled from its patched
source under its own file name, and linecache holds that source, so tracebacks, `inspect` and Triton's JIT
(which reads a kernel's source) see what runs. SPECGATE_SGLANG_FIXES (comma-separated, e.g. `pr37818`) adds
upstream fixes on top. Test setup only.
"""

from __future__ import annotations

import importlib.abc
import importlib.metadata
import linecache
import os
import sys

import patchset


def log(msg: str) -> None:
    print(f"[hybrid pid={os.getpid()}] {msg}", file=sys.stderr, flush=True)


class _PatchingLoader(importlib.abc.Loader):
    """Executes a module from its patched source."""

    def __init__(self, inner, patches: list, release: str) -> None:
        self.inner, self.patches, self.release = inner, patches, release

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        path = module.__spec__.origin
        with open(path, encoding="utf-8") as f:
            source = f.read()
        for fp in self.patches:
            source = patchset.apply(source, fp, self.release)
        lines = source.splitlines(keepends=True)
        linecache.cache[path] = (len(source), None, lines, path)  # mtime None: checkcache keeps it
        exec(compile(source, path, "exec"), module.__dict__)
        log(f"patched {module.__name__} ({', '.join(sorted({fp.diff for fp in self.patches}))})")


class _Finder(importlib.abc.MetaPathFinder):
    """Finds a patched module as the other finders do, then puts the patching loader in front."""

    def __init__(self, modules: dict, release: str) -> None:
        self.modules, self.release = modules, release

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.modules:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                spec.loader = _PatchingLoader(spec.loader, self.modules[fullname], self.release)
                return spec
        return None


def install() -> None:
    """Apply the installed release's set (plus SPECGATE_SGLANG_FIXES) to every module imported from now on; a
    module already imported cannot be patched and is an error."""
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    release = importlib.metadata.version("sglang")
    wanted = tuple(f for f in os.environ.get("SPECGATE_SGLANG_FIXES", "").split(",") if f)
    modules = patchset.by_module(patchset.patch_set(release, wanted))
    early = sorted(m for m in modules if m in sys.modules)
    if early:
        raise patchset.PatchError(f"SGLang {release}: {', '.join(early)} imported before the hybrid patches")
    sys.meta_path.insert(0, _Finder(modules, release))
    log(f"SGLang {release}: hybrid patch set for {len(modules)} modules" + (f", fixes {', '.join(wanted)}"
                                                                           if wanted else ", no fixes"))
