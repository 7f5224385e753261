"""`--vllm-max-model-len` (the vLLM engine's context) on the trainer's side, without vLLM: the setting is checked
against `--max-new-tokens`, and a JSONL task's prompts are checked against the smaller of the model's context and the
engine's before the run starts. The engine's own check (a prompt that does not fit is refused, not cut short) and
its partial weight sync run against the real engine in tests/test_train_vllm.py."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from train.config import TrainConfig  # noqa: E402
from train.errors import Refused  # noqa: E402
from train.model import tiny_model_and_tokenizer  # noqa: E402
from train.rollout import chat_prompts  # noqa: E402
from train.tasks.jsonl import JsonlTask, check_prompts_fit  # noqa: E402


@pytest.mark.parametrize("length", [1, 11, 12])
def test_a_context_without_room_for_a_prompt_is_refused(length):
    with pytest.raises(ValueError, match=f"vllm_max_model_len={length} leaves no room for a prompt beside "
                                         "max_new_tokens=12: expected 0"):  # fmt: skip
        TrainConfig(vllm_max_model_len=length, max_new_tokens=12)
    assert TrainConfig(vllm_max_model_len=13, max_new_tokens=12).vllm_max_model_len == 13
    assert TrainConfig().vllm_max_model_len == 0  # the model's own context, as before the setting existed


@pytest.fixture
def jsonl(tmp_path):
    rows = [{"question": f"{a} + {a} = ?", "answer": str(2 * a)} for a in range(6)]
    rows.append({"question": "y" * 120, "answer": "1"})  # line 7: ~120 tokens of the tiny character tokenizer
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    model, tok = tiny_model_and_tokenizer(0)  # context 256
    return JsonlTask(str(path), heldout_frac=0.3), tok, model, lambda p: chat_prompts(tok, [p], None)[0]


def test_jsonl_prompts_are_checked_against_the_engines_context_when_smaller(jsonl):
    task, tok, model, render = jsonl
    check_prompts_fit(task, tok, model, 12, render)  # the model's 256 tokens: every prompt fits
    check_prompts_fit(task, tok, model, 12, render, engine_context=1000)  # a larger engine: the model's bounds it
    with pytest.raises(Refused) as exc:  # the engine's context is the model's (the flag's 0): nothing to raise
        check_prompts_fit(task, tok, model, 150, render, engine_context=256)
    assert "the model's context is 256 tokens" in str(exc.value) and "--vllm-max-model-len" not in str(exc.value)
    with pytest.raises(Refused) as exc:
        check_prompts_fit(task, tok, model, 12, render, engine_context=100)
    text = str(exc.value)
    assert "line 7: the prompt is" in text and "the vLLM engine's context (--vllm-max-model-len) is 100 tokens" in text
    assert text.endswith("(or lower --max-new-tokens, or raise --vllm-max-model-len)"), text
    with pytest.raises(Refused, match=r"--max-new-tokens 99: the vLLM engine's context \(--vllm-max-model-len\) is "
                                      r"100 tokens and the chat template alone"):  # fmt: skip
        check_prompts_fit(task, tok, model, 99, render, engine_context=100)
