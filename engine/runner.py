"""ModelRunner: executes model forwards on one rank's shard. Owns tensors, makes no policy decisions.

Every method takes plain ints/lists (page tables, slots, lengths), so a
tensor-parallel replica can replay the same call on every rank.
"""

from __future__ import annotations

from pathlib import Path

import torch

from engine import kernels
from engine.cache import KVPool, ModelCaches
from engine.config import EngineConfig
from engine.deterministic import TokenByToken
from engine.model.attention import gather_kv
from engine.model.batch import ForwardBatch
from engine.model.config import HybridConfig, preset
from engine.model.drafter import DFlashDrafter, random_drafter_state_dict
from engine.model.hybrid import HybridLM, random_state_dict
from engine.model.weights import WeightsError, load_config, load_full_state_dict, load_state
from engine.tp.group import SINGLE, TPContext

DEFAULT_WEIGHTS = Path(__file__).resolve().parent / "weights" / "default"
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # EngineConfig.dtype / ssm_dtype


def resolve_model(cfg: EngineConfig) -> tuple[HybridConfig, dict, dict | None]:
    """(architecture, full target weights, full drafter weights or None) for cfg.model_path."""
    path = cfg.model_path
    if path == "default":
        path = str(DEFAULT_WEIGHTS) if (DEFAULT_WEIGHTS / "model.safetensors").exists() else "random"
    if path == "random":
        mcfg = preset(cfg.model_preset)
        return mcfg, random_state_dict(mcfg, cfg.seed), random_drafter_state_dict(mcfg, cfg.seed)
    d = Path(path)
    if not d.is_dir():
        raise WeightsError(f"--model-path {path!r}: not 'default', 'random' or a weights directory")
    mcfg = load_config(d)
    drafter = load_state(d, "drafter") if (d / "drafter.safetensors").exists() else None
    return mcfg, load_state(d), drafter


def _host(logits: torch.Tensor) -> torch.Tensor:
    """Logits on the host, where the scheduler samples, accepts and scores them with the requests' CPU generators
    (on CPU the same tensor, no copy)."""
    return logits.cpu()


class ModelRunner:
    def __init__(self, cfg: EngineConfig, num_pages: int, num_state_slots: int, tp: TPContext = SINGLE):
        torch.manual_seed(cfg.seed)
        self.cfg, self.tp = cfg, tp
        self.device = torch.device(cfg.device)
        mcfg, full, drafter_full = resolve_model(cfg)
        self.model_cfg = mcfg
        self.dtype = TORCH_DTYPES[cfg.dtype]  # weights and activations (bf16 weights load exactly: they are bf16)
        self.model = HybridLM(mcfg, tp).to(self.device, self.dtype).eval()
        load_full_state_dict(self.model, full)
        self.model.requires_grad_(False)  # serving never builds autograd graphs, whatever the grad mode
        self.caches = ModelCaches.build(mcfg, num_pages, cfg.page_size, num_state_slots, tp, self.device,
                                        TORCH_DTYPES[cfg.ssm_dtype], self.dtype)
        self.drafter = None
        self._last_verify = None
        self._verify_bufs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # block size -> verify buffers
        # the drafter runs on rank 0 only (it is small and reads the replicated hidden states)
        if cfg.speculative and cfg.drafter_mode == "model" and tp.rank == 0:
            if drafter_full is None:
                raise WeightsError(f"{cfg.model_path}: no drafter.safetensors, needed for DFLASH")
            self.drafter = DFlashDrafter(mcfg).to(self.device, self.dtype).eval()
            load_full_state_dict(self.drafter, drafter_full)
            self.drafter.requires_grad_(False)
            # drafter context cache: same page tables as the target's KV, its own tensors
            self.draft_kv = KVPool(mcfg.drafter_num_layers, num_pages, cfg.page_size, mcfg.num_key_value_heads,
                                   mcfg.head_dim, dtype=self.dtype, device=self.device)
        self.capture = mcfg.drafter_target_layers if self.drafter is not None else ()
        # --enable-deterministic-inference: every token computed as its lone decode step (engine/deterministic.py)
        self.token_by_token = TokenByToken(self) if cfg.enable_deterministic_inference else None

    @property
    def kv(self) -> KVPool:
        return self.caches.kv

    # --- addressing ---------------------------------------------------------
    def _fb(self, starts: list[int], T: int, pages: list[list[int]], slots: list[int], verify: bool) -> ForwardBatch:
        kv = self.kv
        B = len(starts)
        Lk = max(starts) + T
        positions = torch.tensor([[s + t for t in range(T)] for s in starts])
        write = torch.stack([kv.slots(p, s, s + T) for p, s in zip(pages, starts, strict=True)])
        read = torch.zeros(B, Lk, dtype=torch.long)
        for b, (p, s) in enumerate(zip(pages, starts, strict=True)):
            read[b, : s + T] = kv.slots(p, 0, s + T)
        fb = ForwardBatch(positions=positions.to(self.device), kv_write=write.to(self.device),
                          kv_read=read.to(self.device), kv_lens=torch.tensor([s + T for s in starts]).to(self.device),
                          state_slots=torch.tensor(slots, dtype=torch.long).to(self.device),
                          capture_layers=self.capture)
        if verify:  # intermediates in the pools' dtypes: what gets committed is what a step would store
            fb.rec_inter, fb.conv_inter = self._verify_buffers(B, T)
        return fb

    def _verify_buffers(self, B: int, T: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The verify intermediates [L, B, T, ...] (rec, conv), kept between verifies.

        One buffer per block size, grown to the largest batch seen, instead of a fresh one per verify
        (50 MB at batch 16, B = 8, that the OS would fault in again each time); a verify's states are
        consumed by `commit_verify` before the next verify starts. Stored step-major ([L, T, B, ...],
        exposed as [L, B, T, ...]): step t of every sequence is one contiguous block, which the torch
        delta rule writes in place instead of copying each step's state in (gdn_naive.gdn_verify).
        """
        st = self.caches.state
        bufs = self._verify_bufs.get(T)
        if bufs is None or bufs[0].shape[2] < B:
            bufs = tuple(torch.empty(pool.shape[0], T, B, *pool.shape[2:], dtype=pool.dtype, device=self.device)
                         for pool in (st.rec, st.conv))
            self._verify_bufs[T] = bufs
        return tuple(buf[:, :, :B].transpose(1, 2) for buf in bufs)

    # --- forwards -----------------------------------------------------------
    @torch.inference_mode()
    def extend(self, tokens: list[int], start: int, pages: list[int], slot: int, track_slot: int = -1,
               track_offset: int = -1, logits_from: int = -1) -> torch.Tensor:
        """Prefill chunk of one sequence: positions [start, start+T); state advances. Returns last logits [V].

        With `track_offset` >= 0 the state after that many of these tokens is also stored in
        `track_slot` (a prefill checkpoint, read from the chunked kernel's intermediate states). With
        `logits_from` in [start, start+T) it returns the logits of positions [logits_from, start+T) instead,
        [start+T - logits_from, V] (the last row is the last position's): a request scoring its prompt.
        """
        if self.token_by_token is not None:
            return _host(self.token_by_token.extend(tokens, start, pages, slot, track_slot, track_offset,
                                                    logits_from))
        fb = self._fb([start], len(tokens), [pages], [slot], verify=False)
        if track_offset >= 0:
            fb.track_slots = torch.tensor([track_slot], dtype=torch.long, device=self.device)
            fb.track_offsets = torch.tensor([track_offset], dtype=torch.long, device=self.device)
        hidden, aux = self.model(torch.tensor([tokens], device=self.device), fb, self.caches)
        if aux is not None:
            self._write_draft_ctx(aux, fb)
        if start <= logits_from < start + len(tokens):
            return _host(self.model.logits(hidden[0, logits_from - start:]))
        return _host(self.model.logits(hidden[:, -1])[0])

    @torch.inference_mode()
    def decode(self, tokens: list[int], starts: list[int], pages: list[list[int]], slots: list[int]) -> torch.Tensor:
        """One token per sequence at position starts[b]; states advance. Returns logits [B, V]."""
        if self.token_by_token is not None:
            return _host(self.token_by_token.decode(tokens, starts, pages, slots))
        fb = self._fb(starts, 1, pages, slots, verify=False)
        hidden, aux = self.model(torch.tensor(tokens, device=self.device)[:, None], fb, self.caches)
        if aux is not None:
            self._write_draft_ctx(aux, fb)
        return _host(self.model.logits(hidden[:, 0]))

    @torch.inference_mode()
    def verify(self, blocks: list[list[int]], starts: list[int], pages: list[list[int]], slots: list[int]):
        """Target forward over each block; linear states untouched.

        Returns logits [B, T, V]; the intermediate states stay here for `commit_verify`.
        """
        if self.token_by_token is not None:
            logits, fb, aux = self.token_by_token.verify(blocks, starts, pages, slots)
            self._last_verify = (fb, aux)
            return _host(logits)
        T = len(blocks[0])
        fb = self._fb(starts, T, pages, slots, verify=True)
        hidden, aux = self.model(torch.tensor(blocks, device=self.device), fb, self.caches)
        self._last_verify = (fb, aux)
        return _host(self.model.logits(hidden))

    @torch.inference_mode()
    def draft(self, anchors: list[int], starts: list[int], pages: list[list[int]], block_size: int,
              mask_id: int) -> torch.Tensor:
        """One drafter forward per block [anchor, MASK x (B-1)]; returns logits [B, block_size, V]."""
        B = len(anchors)
        ids = torch.full((B, block_size), mask_id, dtype=torch.long)
        ids[:, 0] = torch.tensor(anchors)
        positions = torch.tensor([[s + t for t in range(block_size)] for s in starts])
        Lc = max(max(starts), 1)
        read = torch.zeros(B, Lc, dtype=torch.long)
        for b, (p, s) in enumerate(zip(pages, starts, strict=True)):
            read[b, :s] = self.kv.slots(p, 0, s)
        # index_select (gather_kv): the same rows as pool[read], without advanced indexing's per-call work
        read = read.to(self.device)
        ctx = [(gather_kv(self.draft_kv.k[i], read), gather_kv(self.draft_kv.v[i], read))
               for i in range(len(self.drafter.layers))]
        hidden = self.drafter(self.model.embed, ids.to(self.device), positions.to(self.device), ctx,
                              torch.tensor(starts, device=self.device))
        return _host(self.model.logits(hidden))

    def _write_draft_ctx(self, aux: torch.Tensor, fb: ForwardBatch, keep: torch.Tensor | None = None) -> None:
        """Cache the drafter's context K/V for these positions (keep [B, T] bool: committed ones only)."""
        kvs = self.drafter.context_kv(aux, fb.positions)
        sel = fb.kv_write if keep is None else fb.kv_write[keep]
        for i, (k, v) in enumerate(kvs):
            if keep is not None:
                k, v = k[keep], v[keep]
            for pool, x in ((self.draft_kv.k[i], k), (self.draft_kv.v[i], v)):  # distinct slots: = pool[sel]
                pool.index_copy_(0, sel.reshape(-1), x.reshape(-1, *x.shape[-2:]).to(pool.dtype))

    @torch.inference_mode()
    def commit_verify(self, working_slots: list[int], commit_lens: list[int], track_slots: list[int],
                      track_steps: list[int], conv_tracked: bool = True,
                      conv_commit_steps: list[int] | None = None) -> None:
        """After acceptance: commit the last verify's states and the drafter context.

        working slot <- step commit_len - 1; tracking slot <- step track_steps[b] (-1: none).
        Fault hooks (engine/faults.py): `conv_tracked=False` leaves the checkpoint's old conv
        window (conv-not-tracked); `conv_commit_steps` commits the working conv window from
        other steps than the recurrent state (conv-rollback-wrong-step).
        """
        fb, aux = self._last_verify
        self._last_verify = None
        st = self.caches.state
        dev = self.device
        track_t = torch.tensor(track_slots, device=dev)
        steps = torch.tensor(track_steps, dtype=torch.long, device=dev)
        saved_conv = None if conv_tracked else st.conv[:, track_t].clone()
        kernels.commit_verified_states(st.rec, st.conv, fb.rec_inter, fb.conv_inter,
                                       torch.tensor(working_slots, device=dev),
                                       torch.tensor(commit_lens, device=dev) - 1, track_t, steps)
        if saved_conv is not None:
            due = steps >= 0
            st.conv[:, track_t[due]] = saved_conv[:, due]
        if conv_commit_steps is not None:
            rows = torch.arange(len(working_slots), device=dev)
            conv_steps = torch.tensor(conv_commit_steps, dtype=torch.long, device=dev)
            st.conv[:, torch.tensor(working_slots, device=dev)] = fb.conv_inter[:, rows, conv_steps].to(st.conv.dtype)
        if self.drafter is not None and aux is not None:
            # only committed block positions enter the drafter's context cache
            keep = torch.arange(aux.shape[1])[None, :] < torch.tensor(commit_lens)[:, None]
            self._write_draft_ctx(aux, fb, keep.to(dev))

    # --- states -------------------------------------------------------------
    def copy_state(self, src: int, dst: int) -> None:
        self.caches.state.copy(src, dst)

    def zero_states(self, slots: list[int]) -> None:
        self.caches.state.zero(slots)
