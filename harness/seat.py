"""Where one replica (or one of its rank actors) sits: its node, the GPUs Ray gave it, the CUDA_VISIBLE_DEVICES its
server gets, and the device's name. Read inside the Ray actor; recorded per replica in config.json."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import asdict, dataclass

NO_NAME = "GPU (model unknown: no nvidia-smi or accelerator type on this node)"


@dataclass(frozen=True)
class Seat:
    """What one actor holds: `gpu_ids` as Ray numbers them on its node ("" / () on CPU)."""

    node_id: str
    node_ip: str
    gpu_ids: tuple[str, ...]
    device: str  # "cpu", or the GPUs' model names

    @property
    def cuda_visible_devices(self) -> str:
        """The server's CUDA_VISIBLE_DEVICES: exactly this actor's GPUs, "" for none (so a CPU replica sees none)."""
        return ",".join(self.gpu_ids)

    @classmethod
    def here(cls) -> Seat:
        """This Ray actor's seat."""
        import ray

        ctx = ray.get_runtime_context()
        ids = tuple(str(i) for i in ray.get_gpu_ids())
        return cls(ctx.get_node_id(), ray.util.get_node_ip_address(), ids, device_name(ids, ctx.get_node_id()))

    def to_json(self) -> dict:
        return {**asdict(self), "gpu_ids": list(self.gpu_ids), "cuda_visible_devices": self.cuda_visible_devices}


def device_name(gpu_ids: tuple[str, ...], node_id: str | None = None) -> str:
    """The GPUs' model names from nvidia-smi, else the node's Ray accelerator type, else NO_NAME; "cpu" for none."""
    if not gpu_ids:
        return "cpu"
    names = _nvidia_smi_names()
    if all(i in names for i in gpu_ids):
        return ", ".join(sorted({names[i] for i in gpu_ids}))
    return _accelerator_type(node_id) or NO_NAME


def _nvidia_smi_names() -> dict[str, str]:
    """GPU index (and UUID) -> model name on this node; {} without nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {}
    try:
        out = subprocess.run([smi, "--query-gpu=index,uuid,name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    names = {}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",", 2)]
        if len(parts) == 3:
            names[parts[0]] = names[parts[1]] = parts[2]
    return names


def _accelerator_type(node_id: str | None) -> str | None:
    """The node's `accelerator_type:<name>` Ray resource (set where Ray recognises the GPU), None without one."""
    import ray

    for n in ray.nodes():
        if n.get("NodeID") == node_id:
            kinds = [k.split(":", 1)[1] for k in n.get("Resources", {}) if k.startswith("accelerator_type:")]
            return ", ".join(sorted(kinds)) or None
    return None
