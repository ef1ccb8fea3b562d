"""The managed engines' GPU and CPU profiles at TP 1, 2 and 4: the command line and environment of each pool's
servers, what each replica reserves, and every spelling of TP, DP and PP in --candidate-args handled or refused."""

from __future__ import annotations

import json
import shlex

import pytest

from harness.cli import from_argv
from harness.config import ConfigError
from harness.placement import CPU, Devices
from harness.replica import ServerSite
from harness.targets import make_target
from tests.harness.fake_vllm import make_interpreter

GPU = Devices("cuda", 1.0)
SGLANG_SPEC = ("--speculative-algorithm DFLASH --speculative-draft-model-path /drafters/qwen3-next "
               "--speculative-dflash-block-size 8 --mamba-radix-cache-strategy extra_buffer")
VLLM_SPEC = '{"method": "ngram", "num_speculative_tokens": 4}'
INHERITED = {"PYTHONPATH": "/repo", "VIRTUAL_ENV": "/repo/.venv", "PATH": "/bin", "HOME": "/root"}


@pytest.fixture
def model(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"vocab_size": 300}))
    return str(d)


def target_of(engine: str, model: str, tmp_path, *extra: str):
    python = ["--sglang-python" if engine == "sglang" else "--vllm-python", make_interpreter(tmp_path / "bin")]
    return make_target(from_argv(["--engine", engine, "--model", model, *python, *extra], {})[0])


def launches(target, devices):
    """pool name -> what its replicas run and reserve on `devices`."""
    plan = target.plan([], {})
    return {p.name: target.placed(p, devices) for p in (*plan.candidates, plan.reference)}


def environment_of(launch, tmp_path, visible: str) -> dict:
    """The server's environment, given what the replica actor set (CUDA_VISIBLE_DEVICES: its GPUs)."""
    site = ServerSite("r0", "127.0.0.1", str(tmp_path / "logs"), "/repo", "key")
    return launch.environment({**INHERITED, "CUDA_VISIBLE_DEVICES": visible}, site)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_sglang_on_gpus_runs_its_own_defaults_at_any_tp(model, tmp_path, tp):
    target = target_of("sglang", model, tmp_path, "--tp-size", str(tp), "--candidate-args", SGLANG_SPEC)
    runs = launches(target, GPU)
    cand, ref = runs["sglang"], runs["reference"]
    assert list(cand.args) == ["--model-path", model, "--tp-size", str(tp), "--random-seed", "0", *SGLANG_SPEC.split()]
    assert list(ref.args) == ["--model-path", model, "--tp-size", str(tp), "--random-seed", "0",
                              "--disable-radix-cache"]
    assert cand.bundles == ref.bundles == ({"CPU": 1, "GPU": float(tp)},)  # its TP workers are the server's own
    assert cand.engine_cfg is None  # no rank actors: SGLang starts them
    env = environment_of(cand, tmp_path, ",".join(map(str, range(tp))))
    assert env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, range(tp)))
    assert "SGLANG_USE_CPU_ENGINE" not in env and "OMP_NUM_THREADS" not in env and "PYTHONPATH" not in env
    assert env["HF_HUB_OFFLINE"] == "1" and env["HOME"].endswith("r0-home")
    assert cand.paths == ((model, "--model"),
                          ("/drafters/qwen3-next", "--speculative-draft-model-path in --candidate-args"))
    assert ref.paths == ((model, "--model"),)
    assert all(target.engine_spec(target.asked(p, "candidate", ())).tp == tp for p in ("sglang",))


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_sglang_on_cpu_runs_its_cpu_path_at_any_tp(model, tmp_path, tp):
    target = target_of("sglang", model, tmp_path, "--tp-size", str(tp), "--device", "cpu")
    runs = launches(target, CPU)
    assert list(runs["sglang"].args) == [
        "--model-path", model, "--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph",
        "--mem-fraction-static", "0.3", "--max-total-tokens", "32768", "--tp-size", str(tp), "--random-seed", "0"]
    assert runs["sglang"].bundles == ({"CPU": 1},)
    env = environment_of(runs["reference"], tmp_path, "")
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["SGLANG_USE_CPU_ENGINE"] == "1" and env["OMP_NUM_THREADS"] == "1"


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_vllm_on_gpus_runs_its_own_defaults_at_any_tp(model, tmp_path, tp):
    spec = f"--enable-prefix-caching --speculative-config '{VLLM_SPEC}'"
    target = target_of("vllm", model, tmp_path, "--tp-size", str(tp), "--candidate-args", spec)
    runs = launches(target, GPU)
    tp_flags = ["--tensor-parallel-size", str(tp)] + (["--distributed-executor-backend", "mp"] if tp > 1 else [])
    common = ["--seed", "0", "--max-model-len", "2048", "--enable-prompt-tokens-details",
              "--return-tokens-as-token-ids"]
    head = ["--model", model, "--served-model-name", "specgate-target", *tp_flags, *common]
    assert list(runs["vllm"].args) == [*head, "--enable-prefix-caching", "--speculative-config",
                                       '{"method":"ngram","num_speculative_tokens":4}']
    assert list(runs["reference"].args) == [*head, "--no-enable-prefix-caching"]
    assert runs["vllm"].bundles == ({"CPU": 1, "GPU": float(tp)},)
    env = environment_of(runs["vllm"], tmp_path, ",".join(map(str, range(tp))))
    assert env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, range(tp))) and env["VLLM_HOST_IP"] == "127.0.0.1"
    assert "VLLM_CPU_KVCACHE_SPACE" not in env and "OMP_NUM_THREADS" not in env and "PYTHONPATH" not in env


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_vllm_on_cpu_runs_eager_with_a_small_kv_cache_at_any_tp(model, tmp_path, tp):
    target = target_of("vllm", model, tmp_path, "--tp-size", str(tp), "--device", "cpu")
    run = launches(target, CPU)["reference"]
    assert list(run.args[:6]) == ["--model", model, "--served-model-name", "specgate-target", "--enforce-eager",
                                  "--tensor-parallel-size"] and run.args[6] == str(tp)
    assert run.bundles == ({"CPU": 1},)
    env = environment_of(run, tmp_path, "")
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["OMP_NUM_THREADS"] == "1"


def test_the_built_in_engine_holds_a_bundle_per_rank_and_runs_every_pool_on_the_device(tmp_path):
    target = make_target(from_argv(["--intervals", "128", "--tp-size", "2", "--device", "cuda"], {})[0])
    for name, launch in launches(target, GPU).items():
        assert launch.bundles == ({"CPU": 1, "GPU": 1.0}, {"CPU": 1, "GPU": 1.0}), name
        assert launch.args[launch.args.index("--device") + 1] == "cuda" and launch.engine_cfg["device"] == "cuda"
    cpu = launches(target, CPU)
    assert all("--device" not in launch.args and launch.bundles == ({"CPU": 1}, {"CPU": 1}) for launch in cpu.values())


@pytest.mark.parametrize("spelling", [
    "--tp 2", "--tp-size=2", "--tensor-parallel-size 4", "--tensor-parallel 4", "--tp_size 2",
    "--dp-size 2", "--dp 2", "--data-parallel-size 2", "--enable-dp-attention",
    "--pp-size 2", "--pp 2", "--pipeline-parallel-size 2",
    "--nnodes 2", "--node-rank 1", "--dist-init-addr h:5000", "--nccl-init-addr h:5000",
    "--base-gpu-id 1", "--gpu-id-step 2", "--device cuda", "--config run.yaml"])
def test_sglang_refuses_every_spelling_of_what_the_harness_places(model, tmp_path, spelling):
    with pytest.raises(ConfigError, match=f"^--candidate-args: {spelling.split()[0].split('=')[0].replace('_', '-')}"
                       r" (\(short for --[a-z-]+\) )?is "):
        target_of("sglang", model, tmp_path, "--candidate-args", spelling)


@pytest.mark.parametrize("spelling", ["--ep-size 2", "--ep 2", "--attention-data-parallel-size 2", "--dcp-size 2",
                                      "--moe-dense-tp-size 1", "--pp-max-micro-batch-size 4"])
def test_sglang_keeps_the_parallelism_inside_a_replica_s_tp_group(model, tmp_path, spelling):
    target = target_of("sglang", model, tmp_path, "--tp-size", "4", "--candidate-args", spelling)
    assert launches(target, GPU)["sglang"].args[-2:] == tuple(spelling.split())


@pytest.mark.parametrize("spelling", [
    "-tp 4", "-tp=4", "--tensor-parallel-size 4", "--tensor_parallel_size 4", "--tensor-parallel 4",
    "-dp 2", "--data-parallel-size 2", "--data-parallel-size-local 1", "-dpl 1", "--data-parallel-address h",
    "-dpb ray", "--data-parallel-hybrid-lb", "--data-parallel-rank 1", "-dpe",
    "--pipeline-parallel-size 2", "-pp 2", "--pipeline 2",
    "--nnodes 2", "-n 2", "--node-rank 1", "-r 1", "--master-addr h", "--headless",
    "--device-ids 0,1", "--distributed-executor-backend ray", "--prefill-context-parallel-size 2", "-pcp 2",
    "--config run.yaml"])
def test_vllm_refuses_every_spelling_of_what_the_harness_places(model, tmp_path, spelling):
    with pytest.raises(ConfigError, match=f"^--candidate-args: {spelling.split()[0].split('=')[0].replace('_', '-')}"
                       r" (\(short for --[a-z-]+\) )?is "):
        target_of("vllm", model, tmp_path, "--candidate-args", spelling)


@pytest.mark.parametrize("spelling", ["--enable-expert-parallel", "-dcp 2", "--decode-context-parallel-size 2"])
def test_vllm_keeps_the_parallelism_inside_a_replica_s_tp_group(model, tmp_path, spelling):
    target = target_of("vllm", model, tmp_path, "--tp-size", "4", "--candidate-args", spelling)
    assert launches(target, GPU)["vllm"].args[-len(spelling.split()):] == tuple(spelling.split())


def test_vllm_s_drafter_runs_on_one_rank_or_on_the_target_s(model, tmp_path):
    def spec(draft_tp: int) -> str:
        return "--speculative-config " + shlex.quote(json.dumps({"method": "eagle", "model": "/drafters/eagle",
                                                                 "num_speculative_tokens": 4,
                                                                 "draft_tensor_parallel_size": draft_tp}))

    for ok in (1, 4):
        target = target_of("vllm", model, tmp_path, "--tp-size", "4", "--candidate-args", spec(ok))
        assert ("/drafters/eagle", "--speculative-config model") in launches(target, GPU)["vllm"].paths
    with pytest.raises(ConfigError, match="draft_tensor_parallel_size 2: the drafter runs on 1 rank or on the "
                       "target's --tp-size 4"):
        target_of("vllm", model, tmp_path, "--tp-size", "4", "--candidate-args", spec(2))


def test_sglang_speculation_on_a_cluster_without_gpus_is_refused_before_anything_starts(model, tmp_path):
    """--device auto cannot know at config time; on a CPU cluster the launch refuses (exit 2 before any start)."""
    from harness.errors import HarnessError

    target = target_of("sglang", model, tmp_path, "--candidate-args", SGLANG_SPEC)
    assert launches(target, GPU)["sglang"].args  # on GPUs: SGLang's DFLASH
    with pytest.raises(HarnessError, match="SGLang's CPU platform refuses --speculative-algorithm DFLASH"):
        launches(target, CPU)


def test_fractions_of_a_gpu_are_for_built_in_replicas_of_one_rank(model, tmp_path):
    assert from_argv(["--gpus-per-rank", "0.25"], {})[0].gpus_per_rank == 0.25
    with pytest.raises(ConfigError, match="--gpus-per-rank 0.5 with --tp-size 2: the ranks of one replica would "
                       "share a GPU"):
        from_argv(["--gpus-per-rank", "0.5", "--tp-size", "2"], {})
    with pytest.raises(ConfigError, match="--gpus-per-rank 0.5: --engine sglang starts its own tensor-parallel "
                       "workers on whole GPUs"):
        target_of("sglang", model, tmp_path, "--gpus-per-rank", "0.5")
    with pytest.raises(ConfigError, match="--gpus-per-rank 1: --device cpu reserves no GPU"):
        from_argv(["--device", "cpu", "--gpus-per-rank", "1"], {})
    with pytest.raises(ConfigError, match="--device places the replicas the harness starts"):
        from_argv(["--endpoint", "http://h:1", "--reference-endpoint", "http://h:2", "--device", "cuda"], {})
