"""What dropping the reference model saves, on paper: exact parameter counts from the models' architecture configs and
the bytes per parameter of each training state, for SmolLM2-135M (the study's model), Qwen2.5-1.5B and Qwen2.5-7B.

The S-GRPO proposal claims "no reference model: ~50% memory". The reference is a frozen copy of the weights (2 bytes a
parameter in bf16); the policy being trained holds its weights (2), gradients (2) and Adam's two moments (fp32, 8),
and with mixed precision an fp32 master copy (4): 12-16 bytes a parameter. Dropping the reference saves 2 / 14 to
2 / 18 of the model states (~11-14%); 50% is what it saves only when weights alone are counted (inference-style:
policy 2 + reference 2). Activations, the KV cache, rollout buffers and the framework's runtime are not counted (they
depend on batch and sequence length, and only dilute the reference's share further).

    python -m benchmarks.memory_on_paper            # writes benchmarks/results/memory_on_paper.md (or --out FILE)
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks import common
from benchmarks.common import check_out, installed, scratch_dir

RESULTS = Path(__file__).resolve().parent / "results"
COMMAND = common.prog("memory_on_paper")  # (the wheel's command sets what prog says before this module loads)
GIB = 2**30


@dataclass(frozen=True)
class Arch:
    """A Llama / Qwen2 decoder: GQA attention, SwiGLU MLP, two RMSNorms per layer and one final."""

    name: str
    source: str
    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool
    qkv_bias: bool

    def params(self) -> int:
        head_dim = self.hidden // self.heads
        q, kv = self.heads * head_dim, self.kv_heads * head_dim
        attn = self.hidden * (q + 2 * kv) + q * self.hidden + (q + 2 * kv if self.qkv_bias else 0)
        mlp = 3 * self.hidden * self.intermediate  # gate, up (hidden -> intermediate), down
        layer = attn + mlp + 2 * self.hidden  # + input and post-attention RMSNorm weights
        embed = self.vocab * self.hidden * (1 if self.tied else 2)  # untied: a separate lm_head
        return embed + self.layers * layer + self.hidden  # + the final norm


# Dims from each model's config.json on the Hugging Face Hub (the URL in `source`)
MODELS = (
    Arch("SmolLM2-135M", "https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct/blob/main/config.json",
         hidden=576, layers=30, intermediate=1536, heads=9, kv_heads=3, vocab=49152, tied=True, qkv_bias=False),
    Arch("Qwen2.5-1.5B", "https://huggingface.co/Qwen/Qwen2.5-1.5B-Instruct/blob/main/config.json",
         hidden=1536, layers=28, intermediate=8960, heads=12, kv_heads=2, vocab=151936, tied=True, qkv_bias=True),
    Arch("Qwen2.5-7B", "https://huggingface.co/Qwen/Qwen2.5-7B-Instruct/blob/main/config.json",
         hidden=3584, layers=28, intermediate=18944, heads=28, kv_heads=4, vocab=152064, tied=False, qkv_bias=True),
)  # fmt: skip
# SmolLM2-135M as loaded by the trainer (sum of p.numel() over model.parameters(); it prints "134.5M")
SMOLLM2_MEASURED = 134_515_008

# Bytes per parameter of each state of full fine-tuning with Adam in bf16 mixed precision
BYTES = {"weights (bf16)": 2, "gradients (bf16)": 2, "Adam moments (2 x fp32)": 8}
MASTER = 4  # optional fp32 master weights
REFERENCE = 2  # the frozen reference model's weights (bf16)


def budget(master: bool) -> dict:
    """Bytes per parameter: the policy's training states, the reference, totals, and the reference's share."""
    policy = sum(BYTES.values()) + (MASTER if master else 0)
    return {"policy": policy, "with_ref": policy + REFERENCE, "share": REFERENCE / (policy + REFERENCE)}


def report() -> str:
    lines = [
        "# Dropping the reference model: what it saves, on paper",
        "",
        f"Produced by `{COMMAND}` (arithmetic only: no model is loaded). Parameter counts from each model's "
        "config.json (`benchmarks/memory_on_paper.py` cites them); q/k/v biases counted for Qwen2; SmolLM2-135M's "
        f"count checked against the loaded model's ({SMOLLM2_MEASURED:,}). Bytes per parameter: "
        + ", ".join(f"{k} {v}" for k, v in BYTES.items())
        + f", optional fp32 master weights {MASTER}, reference model (bf16) {REFERENCE}. **Not included**: "
        "activations, KV cache, rollout buffers, framework runtime (batch- and length-dependent; they only lower the "
        "reference's share).",
        "",
        "| model | parameters | reference (2 B/param) | no master: without reference (12 B/param) | with "
        "reference (14) | reference's share | fp32 master: without reference (16) | with reference (18) | "
        "reference's share | weights only (policy 2 + reference 2): reference's share |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    plain, mixed = budget(False), budget(True)
    for m in MODELS:
        n = m.params()
        gib = [f"{n * b / GIB:.2f} GiB" for b in (REFERENCE, plain["policy"], plain["with_ref"])]
        gib += [f"{n * b / GIB:.2f} GiB" for b in (mixed["policy"], mixed["with_ref"])]
        lines.append(
            f"| {m.name} | {n:,} | {gib[0]} | {gib[1]} | {gib[2]} | "
            f"{plain['share']:.1%} | {gib[3]} | {gib[4]} | {mixed['share']:.1%} | "
            f"{REFERENCE / (BYTES['weights (bf16)'] + REFERENCE):.0%} |"
        )
    lines += [
        "",
        f"Dropping the reference saves **{plain['share']:.1%}** of the model states without master weights "
        f"(2 of {plain['with_ref']} bytes a parameter) and **{mixed['share']:.1%}** with them (2 of "
        f"{mixed['with_ref']}), whatever the model's size. The proposal's \"~50%\" holds only when weights alone are "
        "counted (policy 2 + reference 2 bytes, as in inference): a training run holds gradients and optimizer "
        "state that the reference does not have.",
        "",
        "For comparison, this repository's CPU study trains in fp32 (4 bytes a weight and a gradient, 8 for Adam): "
        f"SmolLM2-135M's reference there is {SMOLLM2_MEASURED * 4 / 2**20:.0f} MiB; `memory-full` measured 507 MiB "
        "saved of 4832 MiB peak (10%: activations and the runtime dilute it), `memory-partial` 556 of 3011 MiB "
        "(18%: with 12 of 30 layers trained, less optimizer state), and with LoRA the reference is free (the policy "
        "with its adapters disabled). docs/study.md, Memory.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="markdown file [default: benchmarks/results/memory_on_paper.md; "
                    "installed (sgrpo-bench memory): ./runs/bench/memory_on_paper.md]")  # fmt: skip
    args = ap.parse_args(argv)
    # installed, RESULTS is inside the package (site-packages): the scratch folder instead
    default = (scratch_dir() if installed() else RESULTS) / "memory_on_paper.md"
    out = args.out if args.out is not None else str(default)
    check_out(ap, "--out", out, "file")  # before the report, not a traceback after it
    text = report()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
