"""What it took to produce a result: software versions, hardware, model and data revisions.

Nothing here reads secrets: environment variables are never recorded, and the model path
is left out unless the user asks for it (`--record-model-path`).
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

from encoder_eval import __version__
from encoder_eval.core import cpu

_PACKAGE_DIR = Path(__file__).resolve().parent


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def harness_git() -> dict:
    """The harness's git commit and whether its tree had uncommitted changes (None outside git)."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=_PACKAGE_DIR,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", str(_PACKAGE_DIR)],
            cwd=_PACKAGE_DIR,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        return {"git_sha": sha, "git_dirty": bool(dirty)}
    except (OSError, subprocess.SubprocessError):
        return {"git_sha": None, "git_dirty": None}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_info(device: str, requested: str | None = None) -> dict:
    """The device the cell really ran on (`cuda:0`, `cpu`) and the one asked for (`auto`),
    the accelerator build and name, whether the GPU runs bf16 natively, and whether the CPU
    does."""
    import torch

    info = {
        "device": device,
        "device_requested": requested,
        "torch_cuda_build": torch.version.cuda,
        "torch_hip_build": getattr(torch.version, "hip", None),
        "cpu": cpu_model(),
        "cpu_native_bf16": cpu.cpu_native_bf16(),
        "gpu": None,
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        index = torch.device(device).index
        index = torch.cuda.current_device() if index is None else index
        info["gpu"] = torch.cuda.get_device_name(index)
        try:
            info["gpu_native_bf16"] = torch.cuda.is_bf16_supported(including_emulation=False)
        except TypeError:  # a torch without the argument: no emulation to tell apart
            info["gpu_native_bf16"] = torch.cuda.is_bf16_supported()
    return info


def software_versions() -> dict:
    return {
        "harness": __version__,
        **harness_git(),
        "python": platform.python_version(),
        "transformers": _version("transformers"),
        "datasets": _version("datasets"),
        "torch": _version("torch"),
        "tokenizers": _version("tokenizers"),
        "accelerate": _version("accelerate"),
        "numpy": _version("numpy"),
        "scikit-learn": _version("scikit-learn"),
        "scipy": _version("scipy"),
    }


def directory_content_hash(path: str | os.PathLike) -> str:
    """sha256 over the relative names and bytes of every file below `path` (hidden files skipped)."""
    root = Path(path)
    digest = hashlib.sha256()
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = file.relative_to(root)
        if any(part.startswith(".") for part in rel.parts):
            continue
        digest.update(str(rel).encode() + b"\0")
        with open(file, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def code_repositories(*auto_maps: dict | None) -> list[str]:
    """The other Hub repositories whose code these `auto_map`s name (`repo--module.Class`,
    as transformers reads them), in first-seen order; code in the model's own repository
    or folder is not listed (it runs at the weights' revision)."""
    repos: list[str] = []
    for auto_map in auto_maps:
        for value in (auto_map or {}).values():
            for ref in value if isinstance(value, list | tuple) else [value]:
                if isinstance(ref, str) and "--" in ref:
                    repo = ref.split("--", 1)[0]
                    if repo not in repos:
                        repos.append(repo)
    return repos


def resolve_commit(repo_id: str, revision: str | None) -> str:
    """The commit a Hub model repository's `revision` (None: its default branch) resolves
    to now: the one Hub lookup pinning remote code takes."""
    from huggingface_hub import HfApi

    return HfApi().model_info(repo_id, revision=revision).sha
