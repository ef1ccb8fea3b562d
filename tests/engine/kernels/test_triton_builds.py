"""How the kernels are built: for real hardware (sm_90, compiled without a GPU) and for the interpreter."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[3]


def _run(args, tmp_path, interpret: bool):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path / "triton-cache"), TRITON_DEFAULT_FP_FUSION="1")
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)


def test_kernels_compile_to_cubin_for_sm90(tmp_path):
    pytest.importorskip("triton.backends.nvidia")
    proc = _run(["-m", "tests.engine.kernels.aot_compile"], tmp_path, interpret=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("cubin") == 11, proc.stdout  # 6 fp32-state cases, 5 of the bf16 engine's layout


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the kernels are compiled, not interpreted")
def test_kernels_fall_back_to_the_interpreter_when_triton_was_imported_first(tmp_path):
    """Another test may import triton before TRITON_INTERPRET is set; without CUDA the kernels still run."""
    script = (
        "import triton, torch, torch.nn.functional as F\n"
        "from engine.kernels import gdn_triton, triton_jit\n"
        "from engine.kernels.gdn_naive import gdn_verify\n"
        "assert not triton.knobs.runtime.interpret and triton_jit.INTERPRET\n"
        "q = F.normalize(torch.randn(1, 2, 1, 4), dim=-1)\n"
        "v, pool = torch.randn(1, 2, 1, 4), torch.randn(2, 1, 4, 4)\n"
        "g, beta = -torch.rand(1, 2, 1), torch.rand(1, 2, 1)\n"
        "o = gdn_triton.fused_recurrent_gdn(q, q, v, g, beta, pool.clone(), torch.tensor([1]), 0.5)\n"
        "o_ref, _ = gdn_verify(q, q, v, g, beta, pool[[1]], 0.5)\n"
        "assert (o - o_ref).abs().max() <= 1e-5\n"
    )
    proc = _run(["-c", script], tmp_path, interpret=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
