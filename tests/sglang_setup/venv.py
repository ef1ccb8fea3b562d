"""The steps of `make sglang` that need logic: SGLang's CPU requirement list, the stand-ins, the final check.

Runs under `.venv-sglang/bin/python` while that venv is being built, so it uses the standard library only.
SGLang's wheel pins a CUDA torch and ~40 GPU packages (shared/reference/sglang-cpu.md); on CPU the
runtime needs the rest of its `Requires-Dist`, installed by name with torch held at the CPU wheel by
constraints.txt, then the wheel itself with `--no-deps`.

    python tests/sglang_setup/venv.py requirements WHEEL   # prints the CPU requirement list
    python tests/sglang_setup/venv.py standins             # installs the stand-ins into this interpreter
    python tests/sglang_setup/venv.py layer BASE_VENV      # see the packages of another SGLang venv (below)
    python tests/sglang_setup/venv.py check VERSION        # what `make sglang` promises, or exit 1
    python tests/sglang_setup/venv.py patches VERSION      # the release's hybrid patch set applies, or exit 1

`layer` makes a second release's venv cheap: a .pth file puts BASE_VENV's site-packages after this venv's own,
so pip counts what BASE has as installed and fetches only what this release pins differently (installed here,
ahead of BASE's copy; pip leaves BASE alone, "outside environment"). The layered venv needs BASE to stay.
"""

from __future__ import annotations

import email.parser
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
STANDINS = HERE / "standins"
PYPATH = HERE / "hybrid" / "pypath"  # patchset.py: the hybrid patch sets, standard library only
LAYER_PTH = "specgate-layer.pth"
# What a CPU SGLang does without: CUDA libraries, GPU kernels (and their compilers), the CUDA torch it pins,
# and torch's CUDA-linked companions; torchvision is a stand-in (standins/torchvision).
GPU_ONLY = {
    "apache-tvm-ffi", "cuda-python", "cuda-tile", "flash-attn-4", "flashinfer-python", "humming-kernels",
    "kernels", "nvidia-cutlass-dsl", "nvidia-mathdx", "nvidia-ml-py", "nvshmem4py-cu13", "quack-kernels",
    "sgl-deep-ep", "sgl-deep-gemm", "sgl-flash-mla", "sglang-kernel", "tilelang", "tokenspeed-mla",
    "torch", "torch-memory-saver", "torchaudio", "torchcodec", "torchvision",
}
# What SGLang imports at start-up but gets, on GPU, through the CUDA torch: the CPU torch wheel has no triton.
EXTRA = ["triton"]
IMPORT_CHECK = ("import sglang.launch_server, sglang.srt.arg_groups.pipeline, sglang.srt.configs, tokenizers; "
                "from transformers import LlamaConfig, PreTrainedTokenizerFast")
# Only these names may look like CUDA in the built venv (the stand-ins and nothing else).
CUDA_NAME = re.compile(r"^(nvidia-|cuda-|.*-cu1[0-9]$|flashinfer|sglang-kernel$|sgl-kernel$)")


def normalize(name: str) -> str:
    """A distribution name as pip compares it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(line: str) -> str:
    """The distribution name at the start of a `Requires-Dist` value (`flashinfer_python[cu13]==0.7.2` ->
    `flashinfer-python`)."""
    return normalize(re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line).group(1))


def cpu_requirements(metadata: str) -> list[str]:
    """SGLang's runtime requirements without the GPU-only ones, plus EXTRA: one pip requirement per line.

    Requirements behind an `extra ==` marker are optional features (tests, other platforms): left out.
    Other environment markers are kept as they are, for pip to evaluate.
    """
    out = []
    for req in email.parser.HeaderParser().parsestr(metadata).get_all("Requires-Dist") or []:
        marker = req.split(";", 1)[1] if ";" in req else ""
        if "extra ==" in marker or requirement_name(req) in GPU_ONLY:
            continue
        out.append(req)
    return out + EXTRA


def wheel_metadata(wheel: Path) -> str:
    """The METADATA file of a wheel."""
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return zf.read(name).decode()


def install_standin(package: Path, site: Path) -> None:
    """Copy one stand-in package into `site` with a dist-info that declares its version (so pip counts it as
    installed: timm's `torchvision` requirement is met by the stand-in instead of a CUDA build)."""
    namespace: dict = {}
    exec((package / "_standin.py").read_text(), namespace)  # DIST and VERSION, without importing the package
    dist, version = namespace["DIST"], namespace["VERSION"]
    shutil.rmtree(site / package.name, ignore_errors=True)
    shutil.copytree(package, site / package.name, ignore=shutil.ignore_patterns("__pycache__"))
    info = site / f"{normalize(dist).replace('-', '_')}-{version}.dist-info"
    shutil.rmtree(info, ignore_errors=True)
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n"
                                   "Summary: specgate's test stand-in (tests/sglang_setup/standins)\n")
    (info / "INSTALLER").write_text("specgate-standin\n")
    files = [p.relative_to(site) for p in sorted((site / package.name).rglob("*")) if p.is_file()]
    rows = [f"{f},," for f in files] + [f"{info.name}/{n},," for n in ("METADATA", "INSTALLER", "RECORD")]
    (info / "RECORD").write_text("\n".join(rows) + "\n")


def check(version: str) -> list[str]:
    """What is wrong with this interpreter as SGLang's CPU venv (empty: nothing)."""
    problems = []
    if importlib.metadata.version("sglang") != version:
        problems.append(f"sglang {importlib.metadata.version('sglang')} installed, {version} asked for")
    torch_version = importlib.metadata.version("torch")
    if not torch_version.endswith("+cpu"):
        problems.append(f"torch {torch_version} is not the CPU build (constraints.txt holds it)")
    standins = {normalize(d.metadata["Name"]) for d in importlib.metadata.distributions()
                if (d.read_text("INSTALLER") or "").strip() == "specgate-standin"}
    missing = {"torchvision", "sgl-kernel-specgate-standin"} - standins
    if missing:
        problems.append(f"stand-ins missing or replaced by a registry build: {', '.join(sorted(missing))}")
    cuda = sorted(n for d in importlib.metadata.distributions()
                  if CUDA_NAME.match(n := normalize(d.metadata["Name"])) and n not in standins)
    if cuda:
        problems.append(f"CUDA packages came in through a dependency: {', '.join(cuda)} (add their parent to "
                        "GPU_ONLY in tests/sglang_setup/venv.py)")
    # In a fresh interpreter, what `python -m sglang.launch_server` imports before it reads a model: the
    # server module, its argument resolution (all of SGLang's model configs), a transformers model config.
    proc = subprocess.run([sys.executable, "-c", IMPORT_CHECK], capture_output=True, text=True,
                          env={**os.environ, "SGLANG_USE_CPU_ENGINE": "1"})
    if proc.returncode:
        problems.append("`import sglang.launch_server` fails:\n" + proc.stderr[-3000:])
    return problems


def layer(base: Path, site: Path) -> str:
    """Put `base`'s site-packages after `site` (a .pth line); the path written, or why not."""
    base_site = next(iter(sorted((base / "lib").glob("python*/site-packages"))), None)
    if base_site is None or not (base / ".installed").is_file():
        return f"no finished SGLang venv at {base} (its .installed stamp): nothing layered"
    if base_site.parent.name != site.parent.name:
        return f"{base} is {base_site.parent.name}, this venv {site.parent.name}: nothing layered"
    (site / LAYER_PTH).write_text(f"{base_site.resolve()}\n")
    return f"layered on {base_site.resolve()}"


def _patchset():
    """tests/sglang_setup/hybrid/pypath/patchset.py, loaded by path (that directory also holds what SGLang's own
    processes import first, so it is not put on sys.path here)."""
    if "patchset" not in sys.modules:
        spec = importlib.util.spec_from_file_location("patchset", PYPATH / "patchset.py")
        sys.modules["patchset"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules["patchset"])
    return sys.modules["patchset"]


def report_patches(version: str, site: Path) -> int:
    """Check that the release's hybrid patch set, and each fix it carries, applies to the installed files; 1 with
    every hunk that does not (the release, the diff, the file, the hunk)."""
    patchset = _patchset()
    have = patchset.releases()
    if version not in have:
        print(f"make sglang: SGLang {version}: no hybrid patch set (have {', '.join(have)}): the plain CPU venv only")
        return 0
    problems = patchset.check(version, site)
    for p in problems:
        print(f"make sglang: {p}", file=sys.stderr)
    if problems:
        print(f"make sglang: SGLang {version}'s hybrid patch set (tests/sglang_setup/hybrid/patches/{version}) does "
              "not apply: fix the diff, or build without it (the plain CPU venv is in place)", file=sys.stderr)
        return 1
    fixes = patchset.fixes(version)
    print(f"make sglang: SGLang {version}: the hybrid patch set applies" + (f", and on top of it the fixes "
          f"{', '.join(fixes)}" if fixes else ""))
    return 0


def main(argv: list[str]) -> int:
    """The command line (see the module doc)."""
    if argv[:1] == ["requirements"] and len(argv) == 2:
        print("\n".join(cpu_requirements(wheel_metadata(Path(argv[1])))))
        return 0
    if argv == ["standins"]:
        site = Path(sysconfig.get_paths()["purelib"])
        for package in sorted(p for p in STANDINS.iterdir() if (p / "_standin.py").is_file()):
            install_standin(package, site)
        return 0
    if argv[:1] == ["layer"] and len(argv) == 2:
        print(f"make sglang: {layer(Path(argv[1]).resolve(), Path(sysconfig.get_paths()['purelib']))}")
        return 0
    if argv[:1] == ["patches"] and len(argv) == 2:
        return report_patches(argv[1], Path(sysconfig.get_paths()["purelib"]))
    if argv[:1] == ["check"] and len(argv) == 2:
        problems = check(argv[1])
        for p in problems:
            print(f"make sglang: {p}", file=sys.stderr)
        return 1 if problems else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
