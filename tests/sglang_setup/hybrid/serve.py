"""`python serve.py <sglang.launch_server args>`: SGLang with the hybrid patches installed, from its own venv.

Test and stretch setup only (docs/gate-sglang.md, "The #37817 path on CPU"); the product never imports it.
Puts pypath/ first on PYTHONPATH (its sitecustomize installs the patches in SGLang's spawned children too),
installs them here, then runs `sglang.launch_server` as `python -m` would. Sets, unless given:
SGLANG_USE_CPU_ENGINE=1, TRITON_INTERPRET=1 (the mamba verify-commit kernels run in Triton's interpreter) and
SGLANG_MAMBA_CONV_DTYPE=float32 (the conv-state pool is bf16 by default; an fp32 model's states would be rounded).
"""

import os
import runpy
import sys

PYPATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pypath")
os.environ["PYTHONPATH"] = PYPATH + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
os.environ["SPECGATE_HYBRID_PATCH"] = "1"
for name, value in (("SGLANG_USE_CPU_ENGINE", "1"), ("TRITON_INTERPRET", "1"), ("SGLANG_MAMBA_CONV_DTYPE", "float32")):
    os.environ.setdefault(name, value)
sys.path.insert(0, PYPATH)
import hybrid_patches  # noqa: E402

hybrid_patches.install()
sys.argv = ["sglang.launch_server", *sys.argv[1:]]
runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)
