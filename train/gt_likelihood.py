"""The ground-truth likelihood reward (proposed in the S-GRPO design notes): the likelihood of the ground-truth answer
given the model's own reasoning, R = P_theta(GT answer | prompt, generated reasoning), computed with the forward-only
op from hidden states (no logits).

Reading (the proposal gives the formula and the outcome, not the details):
- "to replace binary zeros": a correct completion keeps reward 1; a wrong one gets R in [0, 1] (`dense_rewards`).
- "generated reasoning": the completion cut just before its own final answer (`train.rewards.extract_answer`, the
  last occurrence of that answer in the text); the whole completion when it states none. The context is then
  prompt + reasoning + `answer_prefix` ("The answer is "), and R is the probability of the ground-truth answer's
  tokens after it: exp(sum of their log-probs), at temperature 1 (the model's likelihood, not the sampler's).
- The proposal reports that optimizing this reward decouples reasoning from conclusions (reward hacking): the reward
  rises when the reasoning makes the answer likely, whether or not it is valid. This module only computes it; the
  trainer's `--dense-reward gt_likelihood` makes it the reward so a study can show that outcome.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sgrpo_kernels import linear_logprobs
from sgrpo_kernels.integrations.hf import lm_head

from .policy import policy_hidden
from .rewards import extract_answer

IGNORE = -100


def reasoning_of(completion: str) -> str:
    """The completion without its final answer: the text before the last occurrence of `extract_answer`'s answer
    (and before a trailing "The answer is" / "answer:" that introduces it); all of it when there is no answer."""
    answer = extract_answer(completion)
    if answer is None:
        return completion
    cut = completion.rfind(answer)
    if cut < 0:  # the answer was normalized (thousands separators, \\frac): keep the text, minus nothing
        return completion
    head = completion[:cut]
    lowered = head.lower().rstrip()
    for marker in ("the answer is", "answer:", "answer is", "####", "="):
        if lowered.endswith(marker):
            return head[: len(lowered) - len(marker)].rstrip()
    return head.rstrip()


def _ids(tok, text: str) -> list[int]:
    return tok([text], return_tensors="pt", padding=True, add_special_tokens=False)["input_ids"][0].tolist()


def _context_and_answer(tok, context: str, answer: str) -> tuple[list[int], list[int]]:
    """Token ids of `context` and of `answer` after it, split where the joint tokenization splits (a BPE merge
    across the boundary falls back to the answer tokenized alone, without a leading BOS)."""
    ctx, full = _ids(tok, context), _ids(tok, context + answer)
    if full[: len(ctx)] == ctx and len(full) > len(ctx):
        return ctx, full[len(ctx) :]
    ans = _ids(tok, answer)
    bos = getattr(tok, "bos_token_id", None)
    if ans and bos is not None and ans[0] == bos:
        ans = ans[1:]
    return ctx, ans


@torch.no_grad()
def gt_likelihood(
    model,
    tok,
    prompt_texts: list[str],
    completions: list[str],
    answers: list[str],
    *,
    answer_prefix: str = "The answer is ",
    batch_size: int = 32,
    backend: str | None = None,
) -> Tensor:
    """R_i = P(answers[i] | prompt_texts[i] + reasoning_of(completions[i]) + answer_prefix) for each completion, as a
    float64 [N] tensor in [0, 1]. `prompt_texts` are the chat-formatted prompts the completions were sampled from.
    The decoder runs under no_grad, the head through `linear_logprobs` (forward only, no [N, T, V] logits)."""
    n = len(completions)
    if not (len(prompt_texts) == n == len(answers)):
        raise ValueError(
            f"prompt_texts, completions, answers: {len(prompt_texts)}, {n}, {len(answers)} items; expected as many"
        )
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r}: expected an integer >= 1")
    head = lm_head(model)
    device = head.weight.device
    pad = getattr(tok, "pad_token_id", None) or 0
    out = torch.zeros(n, dtype=torch.float64)
    for start in range(0, n, batch_size):
        rows = []
        for i in range(start, min(n, start + batch_size)):
            reasoning = reasoning_of(completions[i])
            context = (prompt_texts[i] + reasoning).rstrip() + " " if reasoning else prompt_texts[i]
            context += answer_prefix
            ctx, ans = _context_and_answer(tok, context, str(answers[i]))
            if not ans:
                raise ValueError(f"answers[{i}]={answers[i]!r} tokenizes to nothing")
            rows.append((ctx + ans, len(ans)))
        width = max(len(ids) for ids, _ in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        targets = torch.full((len(rows), width - 1), IGNORE, dtype=torch.long)
        for r, (seq, n_ans) in enumerate(rows):  # left padding: the answer ends every row
            ids[r, width - len(seq) :] = torch.tensor(seq)
            mask[r, width - len(seq) :] = 1
            targets[r, width - 1 - n_ans :] = ids[r, width - n_ans :]  # hidden t predicts token t + 1
        hidden = policy_hidden(model, ids.to(device), mask.to(device))[:, :-1]
        logp, _ = linear_logprobs(hidden, head.weight, targets.to(device), return_entropy=False, backend=backend,
                                  ignore_index=IGNORE, **head.options())  # fmt: skip
        out[start : start + len(rows)] = logp.double().sum(dim=1).exp().cpu()
    return out


def dense_rewards(correct: Tensor, likelihood: Tensor) -> Tensor:
    """1 for a correct completion, else its GT likelihood (R replaces the binary zeros)."""
    if correct.shape != likelihood.shape:
        raise ValueError(f"correct {tuple(correct.shape)} and likelihood {tuple(likelihood.shape)}: expected one shape")
    return torch.where(correct.bool(), torch.ones_like(likelihood), likelihood)
