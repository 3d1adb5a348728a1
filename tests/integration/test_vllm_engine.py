"""A real vLLM engine driven through accelplat's runner hooks, on a tiny model written locally.

The runner below is the pattern a test suite's ``VllmRunner`` can follow: ``engine_kwargs`` picks
the memory utilization (on CPU one the engine's start-up check accepts), ``before_engine_start``
makes sure the devices have that room, the engine is built, and ``after_engine_shutdown`` waits
for the memory to come back. The model is a 2-layer Llama with a word-level tokenizer and
random ("dummy") weights; nothing is downloaded.

These tests run where vLLM is installed (``.ci/vllm-engine.sh`` builds such an environment with
the CPU build of vLLM) and skip elsewhere. Set ``ACCELPLAT_VLLM_ENGINE_REQUIRED=1`` to make a
missing or broken vLLM an error instead of a skip.
"""

from __future__ import annotations

import gc
import importlib.util
import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

from accelplat import current_platform
from accelplat._types import SettleResult
from accelplat.integrations.vllm import after_engine_shutdown, before_engine_start, engine_kwargs

from .tiny_model import PROMPTS, write_tiny_llama

REQUIRED = os.environ.get("ACCELPLAT_VLLM_ENGINE_REQUIRED") == "1"

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None and not REQUIRED,
    reason="vLLM is not installed here; .ci/vllm-engine.sh runs this test in its own environment",
)

MAX_MODEL_LEN = 128
KV_CACHE_BYTES = 32 * 1024**2
HIDDEN_SIZE = 128

ENGINE_DEFAULTS: dict[str, Any] = {
    "load_format": "dummy",
    "dtype": "float32",
    "enforce_eager": True,
    "distributed_executor_backend": "uni",
    "max_model_len": MAX_MODEL_LEN,
    "max_num_seqs": 4,
    "kv_cache_memory_bytes": KV_CACHE_BYTES,
    "seed": 0,
}


@pytest.fixture(scope="module")
def vllm_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Import vLLM with its caches, temporary files and networking kept inside a temp dir."""
    root = tmp_path_factory.mktemp("vllm")
    env = {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HOME": str(root / "hf"),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_CACHE_ROOT": str(root / "cache"),
        "VLLM_CONFIG_ROOT": str(root / "config"),
        "TMPDIR": str(root / "tmp"),
    }
    (root / "tmp").mkdir()
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        mp.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
        mp.setattr(tempfile, "tempdir", str(root / "tmp"))
        import vllm

        yield vllm


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


class EngineRunner:
    """Builds ``vllm.LLM`` through accelplat's hooks and tears it down the same way.

    Args:
        vllm: The imported ``vllm`` module.
        model: Path of the model directory.
        kwargs: Engine arguments on top of :data:`ENGINE_DEFAULTS`.
    """

    def __init__(self, vllm: Any, model: Path, **kwargs: Any) -> None:
        self.vllm = vllm
        self.kwargs = engine_kwargs({"model": str(model), **ENGINE_DEFAULTS, **kwargs})
        self.before: SettleResult = before_engine_start(self.kwargs)
        self.after: SettleResult | None = None
        self.llm: Any = vllm.LLM(**self.kwargs)

    def __enter__(self) -> EngineRunner:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        llm, self.llm = self.llm, None
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
        cleanup_dist_env_and_memory()
        self.after = after_engine_shutdown(self.kwargs)


def test_default_utilization_passes_the_cpu_engines_start_check(vllm_module: Any) -> None:
    """vLLM's CPU worker refuses to start when ceil(total x utilization) > available memory."""
    from vllm.utils.cpu_resource_utils import get_allowed_cpu_list, get_memory_node_info

    platform = current_platform()
    if platform.name != "cpu":
        pytest.skip(f"the start check read here is the CPU engine's; platform is {platform.name}")
    utilization = engine_kwargs({})["gpu_memory_utilization"]
    node = get_memory_node_info(get_allowed_cpu_list()[0].numa_node)
    requested = math.ceil(node.total_memory * utilization)
    assert requested <= node.available_memory, (
        f"gpu_memory_utilization={utilization} asks for {requested / 2**30:.2f} GiB of "
        f"{node.total_memory / 2**30:.2f} GiB, but vLLM sees {node.available_memory / 2**30:.2f} "
        "GiB available: the CPU engine would refuse to start"
    )


def test_generate_through_the_hooks(vllm_module: Any, tiny_model: Path) -> None:
    platform = current_platform()
    with EngineRunner(vllm_module, tiny_model) as runner:
        assert runner.kwargs["gpu_memory_utilization"] == pytest.approx(
            platform.default_memory_utilization, abs=0.05
        )
        assert 0 < runner.kwargs["gpu_memory_utilization"] <= 1
        if platform.device_type == "cpu":  # no accelerator: the hooks leave it to the engine
            assert runner.before.polls == 0
        else:
            assert runner.before.snapshot.memory  # the hook sampled the engine's devices
        params = vllm_module.SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
        outputs = runner.llm.generate(list(PROMPTS), params)
    assert [o.prompt for o in outputs] == list(PROMPTS)
    for output in outputs:
        assert len(output.outputs[0].token_ids) == 4
    assert runner.llm is None
    assert runner.after is not None
    ratio = 1 - runner.kwargs["gpu_memory_utilization"]
    for device, info in runner.after.snapshot.memory.items():
        assert info.used <= runner.after.targets[device]
        assert runner.after.targets[device] >= math.floor(ratio * info.total) - 2**20


def test_embed_through_the_hooks(vllm_module: Any, tiny_model: Path) -> None:
    with EngineRunner(vllm_module, tiny_model, runner="pooling", convert="embed") as runner:
        outputs = runner.llm.embed(list(PROMPTS))
    assert len(outputs) == 2
    vectors = [list(o.outputs.embedding) for o in outputs]
    for vector in vectors:
        assert len(vector) == HIDDEN_SIZE
        assert all(math.isfinite(x) for x in vector)
        assert math.sqrt(sum(x * x for x in vector)) == pytest.approx(1.0, abs=1e-3)
    assert vectors[0] != vectors[1]
    assert runner.after is not None
