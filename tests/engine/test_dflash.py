"""DFlash: speculative greedy output equals the non-speculative cold path; checkpoints are tracked."""

import pytest

from engine.spec.accept import greedy_accept_len, rejection_sample
from tests.engine.sessions import SUFFIX, make_engine, prompt, req

B = 8


def _sessions(interval, n_offsets=range(-B, 2)):
    return [prompt(interval + off, seed=interval * 100 + off) for off in n_offsets]


def _run_pair(cand, cold, ids, n1=20, n2=12, tag="x"):
    o1 = cand.generate([req(f"{tag}-1", ids, n1)])[0]
    ids2 = tuple(ids) + tuple(o1.output_ids) + SUFFIX
    o2 = cand.generate([req(f"{tag}-2", ids2, n2)])[0]
    r1 = cold.generate([req("c1", ids, n1)])[0]
    r2 = cold.generate([req("c2", ids2, n2)])[0]
    return o1, o2, r1, r2


@pytest.mark.parametrize("interval", [128, 256])
def test_scripted_drafter_matches_cold_path_with_every_commit_length(interval):
    cand = make_engine(speculative_algorithm="DFLASH", speculative_num_draft_tokens=B, mamba_track_interval=interval,
                       drafter_mode="scripted", scripted_accept=-1)
    cold = make_engine(disable_radix_cache=True)
    commit_lens, tracked, restored = set(), 0, 0
    for i, ids in enumerate(_sessions(interval)):
        o1, o2, r1, r2 = _run_pair(cand, cold, ids, n1=40, tag=f"s{i}")
        assert o1.output_ids == r1.output_ids, f"turn 1 of prompt len {len(ids)}"
        assert o2.output_ids == r2.output_ids, f"turn 2 of prompt len {len(ids)}"
        commit_lens |= {c for _, c, _ in o1.spec_trace}
        tracked += sum(s >= 0 for _, _, s in o1.spec_trace)
        restored += o2.cached_tokens > 0
        for pre, c, s in o1.spec_trace:
            crossed = pre // interval != (pre + c) // interval
            assert (s >= 0) == crossed and (not crossed or pre + s + 1 == (pre + c) // interval * interval)
    assert commit_lens == set(range(1, B + 1))
    assert tracked >= 8 and restored == 10


def test_real_drafter_matches_cold_path():
    cand = make_engine(speculative_algorithm="DFLASH", speculative_num_draft_tokens=B, mamba_track_interval=128)
    cold = make_engine(disable_radix_cache=True)
    for i, ids in enumerate(_sessions(128, range(-6, 2, 2)) + _sessions(256, range(-7, 2, 2))):
        o1, o2, r1, r2 = _run_pair(cand, cold, ids, tag=f"d{i}")
        assert o1.output_ids == r1.output_ids and o2.output_ids == r2.output_ids
        assert o1.spec_verify_ct > 0 and o1.spec_accept_length >= 1.0
        assert o1.spec_accept_length == len(o1.output_ids) / o1.spec_verify_ct


def test_spec_with_block_16_and_batching():
    cand = make_engine(speculative_algorithm="DFLASH", speculative_num_draft_tokens=16, mamba_track_interval=64,
                       drafter_mode="scripted", scripted_accept=5)
    cold = make_engine(disable_radix_cache=True)
    reqs = [req(f"b{i}", prompt(50 + 7 * i, seed=i), 30) for i in range(6)]
    outs = cand.generate(reqs)
    refs = cold.generate(reqs)
    assert [o.output_ids for o in outs] == [r.output_ids for r in refs]
    assert all(c == 6 for o in outs for _, c, _ in o.spec_trace[:-1])


def test_scripted_accept_0_is_a_drafter_that_never_agrees():
    """--drafter-mode scripted --scripted-accept 0: every verify step commits its bonus token only (the drafter
    the gate's INCONCLUSIVE acceptance case runs); the output still equals the cold path's."""
    cand = make_engine(speculative_algorithm="DFLASH", speculative_num_draft_tokens=B, mamba_track_interval=128,
                       drafter_mode="scripted", scripted_accept=0)
    cold = make_engine(disable_radix_cache=True)
    reqs = [req(f"n{i}", prompt(120 + 3 * i, seed=i), 16) for i in range(3)]
    outs = cand.generate(reqs)
    assert [o.output_ids for o in outs] == [r.output_ids for r in cold.generate(reqs)]
    assert all(c == 1 for o in outs for _, c, _ in o.spec_trace) and all(o.spec_trace for o in outs)
    assert all(o.spec_verify_ct == len(o.output_ids) - 1 for o in outs)  # the prefill's token, then one per step


def test_greedy_accept_len():
    assert greedy_accept_len([1, 2, 3], [1, 2, 3, 4]) == 3
    assert greedy_accept_len([1, 9, 3], [1, 2, 3, 4]) == 1
    assert greedy_accept_len([9], [1, 2]) == 0


def test_rejection_sampling_preserves_the_target_distribution():
    import torch

    p = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3]])
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(3)
    n = 20000
    for _ in range(n):
        counts[rejection_sample([1], p, gen)[0]] += 1
    assert torch.allclose(counts / n, p[0], atol=0.015)


def test_sampling_is_seeded_and_deterministic():
    e = make_engine(speculative_algorithm="DFLASH", mamba_track_interval=64)
    ids = prompt(40, 9)
    a = e.generate([req("t1", ids, 20, temperature=0.8, seed=7)])[0]
    b = e.generate([req("t2", ids, 20, temperature=0.8, seed=7)])[0]
    c = e.generate([req("t3", ids, 20, temperature=0.8, seed=8)])[0]
    assert a.output_ids == b.output_ids != c.output_ids


def test_verify_buffers_are_kept_grown_and_step_major():
    runner = make_engine(speculative_algorithm="DFLASH", speculative_num_draft_tokens=B).runner
    rec2, conv2 = runner._verify_buffers(2, B)
    L, N = runner.caches.state.rec.shape[:2]
    assert rec2.shape == (L, 2, B, *runner.caches.state.rec.shape[2:])
    assert conv2.shape == (L, 2, B, *runner.caches.state.conv.shape[2:])
    assert all(rec2[layer][:, t].is_contiguous() for layer in range(L) for t in range(B))  # step-major
    rec1, _ = runner._verify_buffers(1, B)
    assert rec1.data_ptr() == rec2.data_ptr()  # a smaller batch reuses the buffer
    rec5, _ = runner._verify_buffers(5, B)
    assert rec5.shape[1] == 5 and runner._verify_buffers(3, B)[0].data_ptr() == rec5.data_ptr()
    assert runner._verify_buffers(2, 2 * B)[0].shape[2] == 2 * B  # its own buffer per block size
