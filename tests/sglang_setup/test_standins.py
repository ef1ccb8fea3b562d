"""The stand-ins of `make sglang` (tests/sglang_setup/standins) and its requirement list.

The stand-ins replace two modules SGLang's CPU path imports but cannot have here (shared/reference/
sglang-cpu.md). What must hold: they compute nothing (every op raises), `hasattr` probes for GPU ops see
nothing, and none of specgate's own packages imports them.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.sglang_setup import venv

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("protocol", "engine", "workloads", "records", "reports", "harness", "training", "benchmarks")
STANDIN_MODULES = {"sgl_kernel", "torchvision"}


def standin_imports(root: Path, packages=PRODUCT) -> list[str]:
    """`file:line: module` for every import of a stand-in (or of the setup that holds them) under `packages`."""
    found = []
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                found += [f"{path.relative_to(root)}:{node.lineno}: {n}" for n in names
                          if n.split(".")[0] in STANDIN_MODULES or n.startswith("tests.sglang_setup")]
    return found


def test_the_product_never_imports_a_standin():
    assert all((ROOT / pkg).is_dir() for pkg in PRODUCT)
    assert standin_imports(ROOT) == []


def test_the_import_scan_catches_one(tmp_path):
    (tmp_path / "harness").mkdir()
    (tmp_path / "harness" / "bad.py").write_text("import json\n\n\ndef f():\n    from sgl_kernel import x_cpu\n")
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "bad.py").write_text("import torchvision.transforms\nimport tests.sglang_setup.venv\n")
    assert standin_imports(tmp_path, ("harness", "reports")) == [
        "harness/bad.py:5: sgl_kernel", "reports/bad.py:1: torchvision.transforms",
        "reports/bad.py:2: tests.sglang_setup.venv"]


def _run_with_standins(code: str) -> dict:
    """Run `code` (which prints one JSON line) in a fresh interpreter that finds the stand-ins first."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env={"PYTHONPATH": str(venv.STANDINS)}, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_sgl_kernel_standin_has_only_cpu_names_and_they_raise():
    out = _run_with_standins("""
        import json, torch
        import sgl_kernel
        from sgl_kernel import copy_all_layer_kv_cache_cpu
        try:
            copy_all_layer_kv_cache_cpu(torch.zeros(1))
            called = "returned"
        except NotImplementedError as e:
            called = str(e)
        try:
            from sgl_kernel import fused_add_rmsnorm
            gpu_import = "imported"
        except ImportError:
            gpu_import = "ImportError"
        from sgl_kernel.mamba import causal_conv1d_fn_cpu
        try:
            causal_conv1d_fn_cpu(torch.zeros(1))
            mamba_call = "returned"
        except NotImplementedError:
            mamba_call = "NotImplementedError"
        ops = torch.ops.sgl_kernel
        try:
            ops.rmsnorm_cpu.default(torch.zeros(1))
            op_call = "returned"
        except NotImplementedError:
            op_call = "NotImplementedError"
        print(json.dumps({"called": called, "gpu_import": gpu_import, "op_call": op_call, "mamba_call": mamba_call,
                          "probes": [hasattr(ops, n) for n in ("convert_weight_packed", "gdn_attention",
                                                               "shm_allreduce", "rmsnorm_cpu", "__wrapped__")],
                          "version": sgl_kernel.VERSION, "file": sgl_kernel.__file__}))
    """)
    assert out["called"].startswith("sgl_kernel.copy_all_layer_kv_cache_cpu was called, but this sgl_kernel is "
                                    "specgate's import stand-in")
    assert out["gpu_import"] == "ImportError" and out["op_call"] == out["mamba_call"] == "NotImplementedError"
    assert out["probes"] == [False, False, False, True, False]
    assert out["version"] == "0.0.0" and out["file"].startswith(str(venv.STANDINS))


def test_torchvision_standin_declares_a_version_and_has_no_operation():
    """What SGLang and transformers import exists (enums are constants); every function raises when called."""
    out = _run_with_standins("""
        import json
        import torchvision
        from torchvision.io import ImageReadMode, decode_image
        from torchvision.transforms import InterpolationMode, functional as TF
        from torchvision.transforms.functional import pil_to_tensor
        from torchvision.transforms.v2 import functional as tvF
        missing, raised = [], []
        for owner, name in ((torchvision, "ops"), (torchvision.transforms, "Resize"), (TF, "resize"),
                            (tvF, "resize"), (torchvision.io, "write_png")):
            try:
                getattr(owner, name)
            except AttributeError as e:
                missing.append(str(e).split(":")[0])
        for fn in (decode_image, pil_to_tensor):
            try:
                fn(b"")
            except NotImplementedError as e:
                raised.append(str(e).split(" was called")[0])
        print(json.dumps({"version": torchvision.__version__, "bicubic": InterpolationMode.BICUBIC.value,
                          "rgb": ImageReadMode.RGB.value, "missing": missing, "raised": raised}))
    """)
    assert out == {"version": "0.0.0+specgate.standin", "bicubic": "bicubic", "rgb": 3,
                   "missing": ["torchvision.ops", "torchvision.transforms.Resize",
                               "torchvision.transforms.functional.resize",
                               "torchvision.transforms.v2.functional.resize", "torchvision.io.write_png"],
                   "raised": ["torchvision.io.decode_image", "torchvision.transforms.functional.pil_to_tensor"]}


def test_standins_install_with_a_dist_info_pip_can_see(tmp_path):
    for package in ("sgl_kernel", "torchvision"):
        venv.install_standin(venv.STANDINS / package, tmp_path)
    dists = {d.metadata["Name"]: d for d in importlib.metadata.distributions(path=[str(tmp_path)])}
    assert {n: d.version for n, d in dists.items()} == {"sgl-kernel-specgate-standin": "0.0.0",
                                                        "torchvision": "0.0.0+specgate.standin"}
    assert dists["torchvision"].read_text("INSTALLER").strip() == "specgate-standin"
    files = sorted(str(f) for f in dists["torchvision"].files)
    assert files == ["torchvision-0.0.0+specgate.standin.dist-info/INSTALLER",
                     "torchvision-0.0.0+specgate.standin.dist-info/METADATA",
                     "torchvision-0.0.0+specgate.standin.dist-info/RECORD",
                     "torchvision/__init__.py", "torchvision/_standin.py", "torchvision/io.py",
                     "torchvision/transforms/__init__.py", "torchvision/transforms/functional.py",
                     "torchvision/transforms/v2/__init__.py", "torchvision/transforms/v2/functional.py"]
    assert all((tmp_path / f).is_file() for f in files)


METADATA = """Metadata-Version: 2.4
Name: sglang
Version: 0.5.23
Requires-Dist: aiohttp
Requires-Dist: flashinfer_python[cu13]==0.7.2
Requires-Dist: av==16.1.0; sys_platform == "linux" and platform_machine == "aarch64"
Requires-Dist: sgl-deep-gemm==0.2.3.post2
Requires-Dist: torch==2.14.1
Requires-Dist: Torch_Memory.Saver>=0.0.9
Requires-Dist: transformers==5.19.0
Requires-Dist: tomli; python_version < "3.11"
Requires-Dist: pytest; extra == "test"
Requires-Dist: torchvision
Provides-Extra: test

Requires-Dist: not-a-header-in-the-body
"""


def test_cpu_requirements_drop_the_gpu_only_ones_and_keep_markers():
    assert venv.cpu_requirements(METADATA) == [
        "aiohttp", 'av==16.1.0; sys_platform == "linux" and platform_machine == "aarch64"',
        "transformers==5.19.0", 'tomli; python_version < "3.11"', "triton"]


@pytest.mark.parametrize("line,name", [("flashinfer_python[cu13]==0.7.2", "flashinfer-python"),
                                       ("Torch_Memory.Saver>=0.0.9", "torch-memory-saver"),
                                       ("tomli; python_version < '3.11'", "tomli")])
def test_requirement_name(line, name):
    assert venv.requirement_name(line) == name
