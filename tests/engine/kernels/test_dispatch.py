"""The dispatch decision without a GPU: CUDA tensors go to Triton unless the references are forced."""

import sys

import pytest
import torch
import torch.nn.functional as F

import engine.kernels as kernels
from engine.kernels import conv_triton, gdn_triton
from tests.engine.kernels.device import DEVICE, on_device

# the Triton scatter module (the dispatch function is kernels.commit_verified_states)
scatter_triton = sys.modules["engine.kernels.state_scatter_triton"]


class _CudaLooking(torch.Tensor):
    """A meta tensor that claims to live on CUDA: all the dispatch looks at."""

    @property
    def is_cuda(self):
        return True


def _cuda_looking():
    return torch.empty(0, device="meta").as_subclass(_CudaLooking)


@pytest.fixture(autouse=True)
def _reset_force_flag():
    kernels.set_force_torch(False)
    yield
    kernels.set_force_torch(False)


class _Recorder:
    def __init__(self, result=None):
        self.calls, self.result = [], result

    def __call__(self, *args):
        self.calls.append(args)
        return self.result


def test_use_triton_follows_device_and_force_flag():
    t = _cuda_looking()
    assert t.is_cuda
    assert kernels.use_triton(t)
    assert not kernels.use_triton(torch.empty(0))
    kernels.set_force_torch(True)
    assert not kernels.use_triton(t)


def test_cuda_tensors_route_to_the_triton_kernels(monkeypatch):
    gdn, conv = _Recorder("o"), _Recorder("y")
    monkeypatch.setattr(gdn_triton, "fused_recurrent_gdn", gdn)
    monkeypatch.setattr(conv_triton, "causal_conv1d_pool", conv)
    t = _cuda_looking()
    assert kernels.gdn_pool_forward(t, t, t, t, t, t, t, 0.5, None) == "o"
    assert gdn.calls == [(t, t, t, t, t, t, t, 0.5, None)]
    assert kernels.conv_pool_forward(t, t, t, t, t) == "y"
    assert conv.calls == [(t, t, t, t, t)]


def test_cuda_state_scatter_routes_to_the_triton_kernel(monkeypatch):
    scatter = _Recorder()
    monkeypatch.setattr(scatter_triton, "state_scatter_triton", scatter)
    t = _cuda_looking()
    kernels.commit_verified_states(*[t] * 8)
    assert scatter.calls == [(t,) * 8]


def test_forced_references_never_call_triton(monkeypatch):
    gdn = _Recorder()
    monkeypatch.setattr(gdn_triton, "fused_recurrent_gdn", gdn)
    monkeypatch.setattr(kernels, "_FORCE_TORCH", False)
    kernels.set_force_torch(True)
    q = F.normalize(torch.randn(1, 2, 1, 4), dim=-1)
    o = kernels.gdn_pool_forward(q, q, torch.randn(1, 2, 1, 4), torch.zeros(1, 2, 1), torch.ones(1, 2, 1),
                                 torch.zeros(2, 1, 4, 4), torch.tensor([1]), 0.5)
    assert o.shape == (1, 2, 1, 4) and gdn.calls == []


def test_dispatch_arguments_reach_the_real_kernels(monkeypatch):
    """With the device check pretended true, the dispatch drives the kernels (interpreted without a GPU) correctly."""
    gen = torch.Generator().manual_seed(0)
    B, T, H, D, C, K = 2, 3, 2, 4, 6, 4
    q = F.normalize(torch.randn(B, T, H, D, generator=gen), dim=-1)
    k = F.normalize(torch.randn(B, T, H, D, generator=gen), dim=-1)
    v, x = torch.randn(B, T, H, D, generator=gen), torch.randn(B, T, C, generator=gen)
    g = -torch.rand(B, T, H, generator=gen)
    beta = torch.rand(B, T, H, generator=gen)
    weight = torch.randn(C, K, generator=gen)
    slots = torch.tensor([3, 1])
    rec = torch.randn(1, 5, H, D, D, generator=gen)
    conv = torch.randn(1, 5, C, K - 1, generator=gen)
    q, k, v, x, g, beta, weight, slots, rec, conv = on_device(q, k, v, x, g, beta, weight, slots, rec, conv)

    def run():
        rec_pool, conv_pool = rec.clone(), conv.clone()
        rec_inter = torch.empty(1, B, T, H, D, D, device=DEVICE)
        conv_inter = torch.empty(1, B, T, C, K - 1, device=DEVICE)
        o = kernels.gdn_pool_forward(q, k, v, g, beta, rec_pool[0], slots, 0.5, rec_inter[0])
        y = kernels.conv_pool_forward(x, conv_pool[0], slots, weight, conv_inter[0])
        o_dec = kernels.gdn_pool_forward(q, k, v, g, beta, rec_pool[0], slots, 0.5)
        y_dec = kernels.conv_pool_forward(x, conv_pool[0], slots, weight)
        return o, y, o_dec, y_dec, rec_pool, conv_pool, rec_inter, conv_inter

    monkeypatch.setattr(kernels, "use_triton", lambda t: False)  # on a GPU too: the torch references
    reference = run()
    monkeypatch.setattr(kernels, "use_triton", lambda t: True)
    triton_out = run()
    for a, b in zip(triton_out, reference, strict=True):
        assert (a - b).abs().max().item() <= 1e-5
