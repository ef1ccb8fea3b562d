"""The hybrid patch sets (tests/sglang_setup/hybrid/patches): how a diff is applied and refused, what each
release's set touches, the #37818 fix, and that each set applies to the release built here."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
spec = importlib.util.spec_from_file_location("patchset", HERE / "hybrid" / "pypath" / "patchset.py")
patchset = sys.modules.setdefault("patchset", importlib.util.module_from_spec(spec))  # dataclasses look it up
spec.loader.exec_module(patchset)

SOURCE = "".join(f"line {i}\n" for i in range(1, 21))
DIFF = """Why: a preamble, ignored.
--- a/sglang/x/mod.py
+++ b/sglang/x/mod.py
@@ -4,3 +4,4 @@
 line 4
-line 5
+line five
+line 5.5
 line 6
@@ -15,2 +16,2 @@
 line 15
-line 16
+line sixteen
"""
RELEASES = ("0.5.19", "0.5.20", "0.5.23")


def test_a_diff_applies_hunk_by_hunk():
    (fp,) = patchset.parse_diff(DIFF, "x.diff")
    assert (fp.path, fp.module, len(fp.hunks)) == ("sglang/x/mod.py", "sglang.x.mod", 2)
    out = patchset.apply(SOURCE, fp, "9.9")
    assert "line five\nline 5.5\nline 6\n" in out and "line sixteen\n" in out and "line 5\n" not in out


def test_a_hunk_applies_at_the_nearest_offset_where_its_lines_stand():
    (fp,) = patchset.parse_diff(DIFF, "x.diff")
    shifted = "extra\nextra\n" + SOURCE
    assert patchset.apply(shifted, fp, "9.9") == "extra\nextra\n" + patchset.apply(SOURCE, fp, "9.9")


def test_a_hunk_that_does_not_stand_is_refused_with_release_diff_file_and_hunk():
    (fp,) = patchset.parse_diff(DIFF, "x.diff")
    with pytest.raises(patchset.PatchError) as err:
        patchset.apply(SOURCE.replace("line 16\n", "line 16 changed\n"), fp, "9.9")
    assert str(err.value).startswith("SGLang 9.9: x.diff: sglang/x/mod.py: hunk @@ -15,2 +16,2 @@ does not apply")


def test_missing_release_and_fix_name_what_exists():
    with pytest.raises(patchset.PatchError, match=r"SGLang 0\.1\.0: no hybrid patch set \(.*0\.5\.19"):
        patchset.patch_set("0.1.0")
    with pytest.raises(patchset.PatchError, match=r"SGLang 0\.5\.23: no fix 'pr37818' \(available: none\)"):
        patchset.patch_set("0.5.23", ("pr37818",))


def test_each_release_has_a_set_that_touches_sglang_only_and_marks_every_change():
    assert set(RELEASES) <= set(patchset.releases())
    for release in RELEASES:
        patches = patchset.patch_set(release)
        assert {fp.diff for fp in patches} == {"cpu-platform.diff", "torch-native-verify.diff", "cpu-kernels.diff",
                                              "dflash-worker.diff"}, release
        for fp in patches:
            assert fp.path.startswith("sglang/") and fp.hunks
            for h in fp.hunks:
                added = set(h.new) - set(h.old)
                assert any("specgate" in line for line in added), (release, fp.path, h.header)


def test_only_0_5_19_carries_the_37818_fix_and_it_compares_with_the_post_verify_lengths():
    assert [r for r in RELEASES if patchset.fixes(r)] == ["0.5.19"]
    (fp,) = [fp for fp in patchset.patch_set("0.5.19", ("pr37818",)) if fp.diff == "fix-pr37818.diff"]
    removed = [line for h in fp.hunks for line in h.old if line not in h.new]
    added = [line for h in fp.hunks for line in h.new if line not in h.old]
    assert fp.path == "sglang/srt/speculative/dflash_worker_v2.py"
    assert sum("batch.seq_lens // mamba_track_interval" in line for line in removed) == 2
    assert sum("seq_lens_post_verify // mamba_track_interval" in line for line in added) == 2
    assert any("seq_lens_post_verify=new_seq_lens" in line for line in added)


def _site(release: str) -> Path | None:
    venv = ROOT / (".venv-sglang" if release == "0.5.23" else f".venv-sglang-{release}")
    stamp = venv / ".installed"
    if not stamp.is_file() or stamp.read_text().strip() != release:
        return None
    return next(iter((venv / "lib").glob("python*/site-packages")))


@pytest.mark.parametrize("release", RELEASES)
def test_the_set_applies_to_the_release_built_here(release):
    """Every hunk, and every fix on top, against the installed release (the check `make sglang` runs)."""
    site = _site(release)
    if site is None:
        required = {"0.5.23", "0.5.19"} if os.environ.get("SPECGATE_REQUIRE_SGLANG") == "1" else set()
        if release in required:
            pytest.fail(f"SPECGATE_REQUIRE_SGLANG=1 but SGLang {release}'s venv is missing (.ci/run builds it)")
        pytest.skip(f"no SGLang {release} venv here (make sglang SGLANG_VERSION={release})")
    assert patchset.check(release, site) == []


def test_make_sglang_refuses_a_set_that_does_not_apply_and_builds_a_release_without_one(tmp_path, capsys):
    """`venv.py patches V` (a step of `make sglang`): exit 1 naming the release, diff, file and hunk; a release
    without a set is the plain CPU venv (exit 0)."""
    from tests.sglang_setup import venv

    target = tmp_path / "sglang/srt/arg_groups/choices.py"
    target.parent.mkdir(parents=True)
    target.write_text("DRAFT_ATTENTION_BACKEND_CHOICES = []\n")
    assert venv.report_patches("0.5.23", tmp_path) == 1
    err = capsys.readouterr().err
    assert "make sglang: SGLang 0.5.23: cpu-platform.diff: sglang/srt/arg_groups/choices.py: hunk @@" in err
    assert "does not apply" in err and "sglang/srt/arg_groups/mamba_hook.py is not installed" in err
    assert venv.report_patches("0.4.0", tmp_path) == 0
    assert "SGLang 0.4.0: no hybrid patch set" in capsys.readouterr().out


HOOKED = '''
import inspect, json, sys
import hybrid_hook, patchset
diff = """--- a/fakesg/mod.py
+++ b/fakesg/mod.py
@@ -1,3 +1,4 @@
 def f():
-    return 1
+    # patched
+    return 2

"""
sys.meta_path.insert(0, hybrid_hook._Finder(patchset.by_module(patchset.parse_diff(diff, "t.diff")), "9.9"))
import fakesg.mod as m
print(json.dumps({"f": m.f(), "source": inspect.getsource(m.f), "file": m.__file__}))
'''


def test_the_import_hook_runs_the_patched_source_and_shows_it(tmp_path):
    """A patched module runs its patched source under its own file name, and `inspect` (which Triton's JIT reads a
    kernel's source with) sees the patched lines, not the file's."""
    (tmp_path / "fakesg").mkdir()
    (tmp_path / "fakesg" / "__init__.py").write_text("")
    (tmp_path / "fakesg" / "mod.py").write_text("def f():\n    return 1\n\n")
    proc = subprocess.run([sys.executable, "-c", HOOKED], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{HERE / 'hybrid' / 'pypath'}"})
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"f": 2, "source": "def f():\n    # patched\n    return 2\n",
                   "file": str(tmp_path / "fakesg" / "mod.py")}
    assert "patched fakesg.mod (t.diff)" in proc.stderr
