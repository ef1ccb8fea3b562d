"""Who the server says it is: the model id (`--served-model-name`), the names it also answers to, and the directory
that holds its tokenizer files.

As vLLM does, the id defaults to the weights directory's absolute path, so that a
load tool that loads its tokenizer from the model id (GuideLLM, AIPerf, `vllm
bench serve`) finds `tokenizer.json` and `tokenizer_config.json` there. Random
weights (`--model-path random`, or `default` before training) have no
directory: their id is the byte tokenizer's directory
(protocol/data/byte_tokenizer), the one place that holds what such a tool needs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from engine.config import EngineConfig
from engine.runner import DEFAULT_WEIGHTS
from engine.server.validate import ApiError, show
from protocol.tokenizer import BYTE_TOKENIZER_DIR

log = logging.getLogger("specgate.server")

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def weights_directory(model_path: str) -> Path | None:
    """The absolute weights directory `--model-path` serves, or None for random weights (what engine.runner loads)."""
    if model_path == "default":
        return DEFAULT_WEIGHTS if (DEFAULT_WEIGHTS / "model.safetensors").exists() else None
    if model_path == "random":
        return None
    return Path(model_path).expanduser().resolve()


def has_tokenizer(directory: Path) -> bool:
    return all((directory / name).is_file() for name in TOKENIZER_FILES)


@dataclass(frozen=True)
class ServedModel:
    """The id /v1/models lists, its `root` directory, where the tokenizer files are, and the accepted aliases."""

    name: str
    root: str
    tokenizer_dir: str
    aliases: tuple[str, ...]

    def answer_name(self, requested) -> str:
        """The `model` an answer carries: the requested name if it is one of ours (as vLLM echoes it), the served
        name when none was given; a 404 naming the served model otherwise."""
        if requested is None:
            return self.name
        if requested == self.name or requested in self.aliases:
            return requested
        others = ", ".join(repr(a) for a in self.aliases)
        raise ApiError(404, f"model: {show(requested)} does not exist here; the served model is {self.name!r} "
                            f"(also accepted: {others})", "model")


def served_model(cfg: EngineConfig, served_model_name: str | None = None) -> ServedModel:
    """The ServedModel of an engine configured by `cfg`; warns when a weights directory lacks its tokenizer files."""
    weights = weights_directory(cfg.model_path)
    root = weights if weights is not None else BYTE_TOKENIZER_DIR
    tokenizer_dir = root if has_tokenizer(root) else BYTE_TOKENIZER_DIR
    if tokenizer_dir != root:
        log.warning("weights directory %s has no %s: a tool that loads its tokenizer from the model id will not "
                    "find it (write them with: python -m protocol.byte_export --write %s)", root,
                    " / ".join(TOKENIZER_FILES), root)
    name = served_model_name or str(root)
    # names clients used before the id was a path: the --model-path as given, and random-<preset>
    legacy = [cfg.model_path, str(root)]
    if weights is None:
        legacy += ["random", f"random-{cfg.model_preset}"]
    aliases = tuple(dict.fromkeys(a for a in legacy if a != name))
    return ServedModel(name=name, root=str(root), tokenizer_dir=str(tokenizer_dir), aliases=aliases)
