"""Request bodies that peer load tools send, written from their public source (nothing is downloaded).

Each entry: (name, path, body, extra headers). PROMPT and N are filled in by
`bodies(model, prompt, n)`; everything else is what the tool puts on the wire.
"""

from __future__ import annotations


def bodies(model: str, prompt: str, n: int) -> list[tuple[str, str, dict, dict]]:
    text_part = [{"type": "text", "text": prompt}]
    return [
        # GuideLLM, src/guidellm/backends/openai/request_handlers.py (vllm-project/guidellm @ ee7a7745),
        # TextCompletionsRequestHandler.format: streaming adds stream_options with continuous_usage_stats; a
        # fixed output length adds max_tokens, stop=None and ignore_eos.
        ("guidellm-completions", "/v1/completions",
         {"model": model, "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True},
          "max_tokens": n, "stop": None, "ignore_eos": True, "prompt": prompt}, {}),
        # GuideLLM, same file, ChatCompletionsRequestHandler.format (its default request type): the user content is
        # a list of text parts (_format_prompts), max_completion_tokens instead of max_tokens.
        ("guidellm-chat", "/v1/chat/completions",
         {"model": model, "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True},
          "max_completion_tokens": n, "stop": None, "ignore_eos": True,
          "messages": [{"role": "user", "content": text_part}]}, {}),
        # vllm bench serve, vllm/benchmarks/lib/endpoint_request_func.py (vllm-project/vllm @ 02cfb534),
        # async_request_openai_completions: logprobs None unless --logprobs; --ignore-eos and --temperature go
        # through _update_payload_common / extra_body; --request-id-prefix sends x-request-id.
        ("vllm-bench-completions", "/v1/completions",
         {"model": model, "prompt": prompt, "repetition_penalty": 1.0, "max_tokens": n, "logprobs": None,
          "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True, "temperature": 0.0},
         {"x-request-id": "bench-0"}),
        # vllm bench serve, same file, async_request_openai_chat_completions (_get_chat_messages: text parts).
        ("vllm-bench-chat", "/v1/chat/completions",
         {"model": model, "messages": [{"role": "user", "content": text_part}], "max_completion_tokens": n,
          "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}, {}),
        # AIPerf, src/aiperf/endpoints/openai_chat.py (ai-dynamo/aiperf), ChatEndpoint.format_payload: a single
        # text turn renders as a plain string (base_endpoint._render_turn_content); include_usage is forced when
        # streaming. The extras are its documented fixed-length recipe: --extra-inputs min_tokens:N
        # --extra-inputs ignore_eos:true --extra-inputs '{"nvext":{"ignore_eos":true}}'.
        ("aiperf-chat", "/v1/chat/completions",
         {"messages": [{"role": "user", "content": prompt}], "model": model, "stream": True,
          "max_completion_tokens": n, "min_tokens": n, "ignore_eos": True, "nvext": {"ignore_eos": True},
          "stream_options": {"include_usage": True}}, {}),
        # AIPerf, src/aiperf/endpoints/openai_completions.py, CompletionsEndpoint.format_payload: the prompt is a
        # list of the turn's texts; non-streaming unless --streaming.
        ("aiperf-completions", "/v1/completions",
         {"prompt": [prompt], "model": model, "stream": False, "max_tokens": n, "min_tokens": n,
          "ignore_eos": True}, {}),
        # sglang.bench_serving, python/sglang/bench_serving.py (sgl-project/sglang @ 0033168f),
        # async_request_sglang_generate (--backend sglang): native /generate.
        ("sglang-bench-generate", "/generate",
         {"text": prompt, "sampling_params": {"temperature": 0.0, "max_new_tokens": n, "ignore_eos": True},
          "stream": True, "lora_path": None, "return_logprob": False, "logprob_start_len": -1}, {}),
        # sglang.bench_serving, same file, async_request_openai_completions (--backend sglang-oai / vllm).
        ("sglang-bench-oai", "/v1/completions",
         {"model": model, "prompt": prompt, "temperature": 0.0, "best_of": 1, "max_tokens": n, "stream": True,
          "ignore_eos": True}, {}),
        # sglang.bench_serving, same file, async_request_openai_chat_completions (--backend sglang-oai-chat).
        ("sglang-bench-oai-chat", "/v1/chat/completions",
         {"model": model, "messages": [{"role": "user", "content": prompt}], "temperature": 0.0, "max_tokens": n,
          "stream": True}, {}),
    ]
