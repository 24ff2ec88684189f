"""A real vLLM engine on loopback, serving the tiny model made here (tooling.stack.tiny_model).

What lives here: `VllmSettings` (the flags that matter), `VllmEngine` (make the model once,
start `vllm serve`, wait for /health, read what it reports, stop it and its children),
`EngineFacts` (KV capacity, block size, batch slots, max model length, as the engine says)
and `vllm_available`. Used by `slogate engine vllm`, `slogate up --engine vllm` and the
tests marked `vllm`.

Everything vLLM writes stays in one project-local folder git ignores (`.cache/vllm`, or
`$SLOGATE_VLLM_HOME`): the model, vLLM's, torch inductor's and Hugging Face's caches and its
temporary files. Nothing is downloaded: the offline variables are set.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import random
import socket
import subprocess
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from extproc.runtime.processes import ManagedProcess, ProcessFailed
from tooling.stack import tiny_model
from tooling.stack.processes import free_port

HOST = "127.0.0.1"
BLOCK_TOKENS = 128  # the CPU build's KV block size (reported again in cache_config_info)
# Import of torch and vLLM in three processes is most of it (~40-50 s here, more under load).
START_TIMEOUT_S = 300.0


def vllm_available() -> bool:
    """The extra is installed and its workarounds applied (tooling.build.vllm_install)."""
    if importlib.util.find_spec("vllm") is None:
        return False
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def engine_home() -> Path:
    """Where the model and vLLM's caches live: `$SLOGATE_VLLM_HOME`, else `.cache/vllm` in
    the source checkout (the folder holding pyproject.toml), else in the current one."""
    configured = os.environ.get("SLOGATE_VLLM_HOME")
    if configured:
        return Path(configured)
    checkout = Path(__file__).resolve().parents[2]
    base = checkout if (checkout / "pyproject.toml").exists() else Path.cwd()
    return base / ".cache" / "vllm"


@dataclass(frozen=True)
class VllmSettings:
    port: int = 0  # 0: a free one
    served_names: tuple[str, ...] = ("deepseek-v4",)
    max_model_len: int = 8192
    # KV blocks of BLOCK_TOKENS: 80 = 10,240 tokens, small enough for a test to fill.
    kv_blocks: int = 80
    max_num_seqs: int = 16
    priority_scheduling: bool = False
    # Publish KV cache events on (HTTP port + first, HTTP port + second): PUB and replay
    # (several engines on one host; a pool's `kv_events: {relative_ports: true}`). None: off.
    kv_events_after_port: tuple[int, int] | None = None
    # VLLM_SERVER_DEV_MODE: its /reset_prefix_cache (a benchmark's arms start cold).
    dev_mode: bool = False
    extra_args: tuple[str, ...] = ()
    # The cores its engine's threads are bound to (vLLM's VLLM_CPU_OMP_THREADS_BIND, e.g.
    # "1"); "": vLLM's own choice, which binds every engine on a machine to the same first
    # core(s) and keeps one for its API server.
    cpu_cores: str = ""


@dataclass(frozen=True)
class EngineFacts:
    """What the running engine says about itself."""

    version: str
    kv_capacity_tokens: int
    block_size: int
    blocks: int
    max_num_seqs: int
    max_model_len: int
    models: tuple[str, ...]

    def summary(self) -> str:
        return (
            f"vLLM {self.version}, KV cache {self.kv_capacity_tokens:,} tokens "
            f"({self.blocks} blocks of {self.block_size}), {self.max_num_seqs} batch slots, "
            f"max model len {self.max_model_len:,}, models {', '.join(self.models)}"
        )


def offline_env(home: Path) -> dict[str, str]:
    """No network, no telemetry, and every cache inside `home`."""
    tmp = home / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    return {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CACHE_ROOT": str(home / "vllm-cache"),
        "TORCHINDUCTOR_CACHE_DIR": str(home / "inductor-cache"),
        "HF_HOME": str(home / "hf"),
        "TMPDIR": str(tmp),
        # The CPU backend reserves its KV cache up front; 1 GiB is its smallest setting
        # (--num-gpu-blocks-override then uses only a part of it).
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }


def ensure_model(home: Path) -> Path:
    """The tiny model under `home`, made on first use (~8 s) in a child process."""
    folder = home / "tiny-model"
    if not tiny_model.is_built(folder):
        done = subprocess.run(
            [sys.executable, "-m", "tooling.stack.tiny_model", str(folder)],
            env={**os.environ, **offline_env(home)},
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise ProcessFailed(f"making the tiny model failed:\n{done.stderr[-4000:]}")
    return folder


@dataclass
class VllmEngine:
    log_dir: Path
    settings: VllmSettings = field(default_factory=VllmSettings)
    home: Path = field(default_factory=engine_home)
    name: str = "vllm"
    process: ManagedProcess | None = None
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def argv(self, model: Path) -> list[str]:
        s = self.settings
        argv = [
            str(Path(sys.executable).parent / "vllm"),
            "serve",
            str(model),
            "--host", HOST,
            "--port", str(self.port),
            "--served-model-name", *s.served_names,
            "--max-model-len", str(s.max_model_len),
            "--dtype", "bfloat16",
            # Compiling takes ~50 s more at start and its cache does not reload on this build.
            "--enforce-eager",
            "--num-gpu-blocks-override", str(s.kv_blocks),
            "--max-num-seqs", str(s.max_num_seqs),
            # On the CPU backend this is the share of the NUMA node's memory reserved; at the
            # default 0.92 it refuses to start on a machine with other processes running.
            "--gpu-memory-utilization", "0.25",
            "--enable-prompt-tokens-details",
            "--scheduling-policy", "priority" if s.priority_scheduling else "fcfs",
            *s.extra_args,
        ]  # fmt: skip
        if s.kv_events_after_port is not None:
            pub, replay = s.kv_events_after_port
            argv += kv_events_args(self.port + pub, self.port + replay)
        return argv

    def start(self) -> VllmEngine:
        return self.launch().ready()

    def launch(self) -> VllmEngine:
        """Start the process, not waiting for it (several engines start side by side)."""
        model = ensure_model(self.home)
        self.port = self.port or self.settings.port or self._free_port()
        env = offline_env(self.home)
        if self.settings.dev_mode:
            env["VLLM_SERVER_DEV_MODE"] = "1"
        if self.settings.cpu_cores:
            env["VLLM_CPU_OMP_THREADS_BIND"] = self.settings.cpu_cores
        self.process = ManagedProcess(
            self.name, self.argv(model), self.log_dir, env, group=True
        ).start()
        return self

    def _free_port(self) -> int:
        """A free port; when the engine publishes KV events, one below the OS's ephemeral
        range whose event ports are free too: an ephemeral one's neighbours are handed out
        to any socket meanwhile (vLLM's own ZMQ ones took a PUB port so, once in three
        runs), these only to a program that names them."""
        offsets = self.settings.kv_events_after_port
        if offsets is None:
            return free_port(HOST)
        rng = random.SystemRandom()
        for _ in range(200):
            port = rng.randrange(20_000, 32_000)
            if all(_port_free(port + offset) for offset in (0, *offsets)):
                return port
        raise ProcessFailed("no free port with free KV event ports beside it")

    def ready(self) -> VllmEngine:
        """Wait until it answers /health (a failed start is stopped and raised)."""
        assert self.process is not None
        try:
            self.process.wait_for_http(f"{self.url}/health", timeout_s=START_TIMEOUT_S)
        except BaseException:
            self.stop()
            raise
        return self

    def facts(self) -> EngineFacts:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as response:
            text = response.read().decode()
        with urllib.request.urlopen(f"{self.url}/v1/models", timeout=10) as response:
            models = json.loads(response.read())["data"]
        return engine_facts(text, models, self.settings.max_num_seqs)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(timeout_s=20)


def kv_events_args(pub_port: int, replay_port: int) -> tuple[str, ...]:
    """vLLM's flag for publishing its KV cache events (vllm/config/kv_events.py). Its PUB
    socket binds only a wildcard endpoint (`tcp://*:P`; `tcp://127.0.0.1:P` makes it
    connect there instead: ZmqEventPublisher._is_bind_endpoint), the replay socket any."""
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{pub_port}",
        "replay_endpoint": f"tcp://{HOST}:{replay_port}",
    }
    return ("--kv-events-config", json.dumps(config))


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("", port))  # the PUB socket binds every address
        except OSError:
            return False
    return True


def engine_facts(metrics_text: str, models: list[dict[str, object]], slots: int) -> EngineFacts:
    """From `vllm:cache_config_info` (KV size, blocks) and /v1/models (max_model_len).
    Batch slots are not in either: they are what the engine was started with."""
    info: dict[str, str] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == "vllm:cache_config_info":
                info = dict(sample.labels)
    if not info:
        raise ProcessFailed("the engine's /metrics has no vllm:cache_config_info")
    block = int(info.get("block_size", BLOCK_TOKENS))
    blocks = int(info["num_gpu_blocks"])
    tokens = int(info.get("kv_cache_size_tokens") or blocks * block)
    version = importlib.metadata.version("vllm")
    names = tuple(str(m["id"]) for m in models)
    lengths = [int(str(m["max_model_len"])) for m in models if m.get("max_model_len")]
    return EngineFacts(version, tokens, block, blocks, slots, min(lengths or [0]), names)
