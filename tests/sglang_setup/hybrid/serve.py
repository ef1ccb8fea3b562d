"""`python serve.py <sglang.launch_server args>`: SGLang with its release's hybrid patch set, from its own venv.

Test setup only (docs/gate-sglang.md, section 5); the product never imports it. Puts pypath/ first on PYTHONPATH
(its sitecustomize installs the patch set in SGLang's spawned children too), installs it here, then runs
`sglang.launch_server` as `python -m` would. SPECGATE_SGLANG_FIXES=pr37818 adds that upstream fix where the
release has it (patches/<release>/fix-pr37818.diff); SPECGATE_HYBRID_TRACE=1 logs every verify step's commit
(pypath/hybrid_trace.py). Sets, unless given: SGLANG_USE_CPU_ENGINE=1 and SGLANG_MAMBA_CONV_DTYPE=float32 (the
conv-state pool is bf16 by default; an fp32 model's states would be rounded).
"""

import os
import runpy
import sys

PYPATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pypath")
os.environ["PYTHONPATH"] = PYPATH + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
os.environ["SPECGATE_HYBRID_PATCH"] = "1"
for name, value in (("SGLANG_USE_CPU_ENGINE", "1"), ("SGLANG_MAMBA_CONV_DTYPE", "float32")):
    os.environ.setdefault(name, value)
sys.path.insert(0, PYPATH)
import hybrid_hook  # noqa: E402

hybrid_hook.install()
sys.argv = ["sglang.launch_server", *sys.argv[1:]]
runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)
