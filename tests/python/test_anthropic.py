"""The official anthropic Python client against a live `spindle serve` on the demo model.

Random weights: answers are compared with themselves (streamed against whole, counted
against used), never with an expected text.
"""

import anthropic
import pytest

# The 2.x SDK has no sampling arguments; the server still reads them from the body.
GREEDY = {"model": "claude-anything", "max_tokens": 24, "extra_body": {"temperature": 0}}
HELLO = [{"role": "user", "content": "Hello!"}]


@pytest.fixture
def client(server):
    return anthropic.Anthropic(base_url=server.root, api_key="unused", max_retries=0, timeout=60)


def text_of(message):
    return "".join(b.text for b in message.content if b.type == "text")


def test_messages_create(client):
    r = client.messages.create(system="Be brief.", messages=HELLO, **GREEDY)
    assert r.type == "message" and r.role == "assistant"
    assert r.model == "spindle-demo"
    assert r.stop_reason in ("end_turn", "max_tokens")
    assert 1 <= r.usage.output_tokens <= 24
    assert r.usage.input_tokens > 3
    assert isinstance(text_of(r), str)


def test_streaming_matches_whole_message(client):
    whole = client.messages.create(messages=HELLO, **GREEDY)
    with client.messages.stream(messages=HELLO, **GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == text_of(whole)
    assert text_of(final) == text_of(whole)
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_count_tokens_counts_the_prompt_used(client):
    whole = client.messages.create(messages=HELLO, **GREEDY)
    counted = client.messages.count_tokens(model="m", messages=HELLO)
    # As Anthropic counts: input_tokens are those not read from the (prefix) cache.
    assert counted.input_tokens == whole.usage.input_tokens + whole.usage.cache_read_input_tokens


def test_tool_use_round_trip(client):
    tools = [{
        "name": "get_weather",
        "description": "Weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }]
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01", "content": "21 C and sunny"},
        ]},
    ]
    r = client.messages.create(messages=messages, tools=tools, **GREEDY)
    assert r.stop_reason in ("end_turn", "max_tokens", "tool_use")
    for block in r.content:
        if block.type == "tool_use":
            assert isinstance(block.input, dict) and block.id.startswith("toolu_")
    # The tools and the tool result reach the prompt.
    plain = client.messages.count_tokens(model="m", messages=messages[:1])
    full = client.messages.count_tokens(model="m", messages=messages, tools=tools)
    assert full.input_tokens > plain.input_tokens + 20


def test_forced_tool_choice_yields_a_valid_call(client):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                               "days": {"type": "integer", "minimum": 1, "maximum": 7}},
              "required": ["city", "days"]}
    tools = [{"name": "forecast", "input_schema": schema},
             {"name": "other", "input_schema": {"type": "object"}}]
    for choice in ({"type": "any"}, {"type": "tool", "name": "forecast"}):
        answer = client.messages.create(messages=HELLO, tools=tools, tool_choice=choice,
                                        **{**GREEDY, "max_tokens": 96})
        calls = [b for b in answer.content if b.type == "tool_use"]
        assert calls, answer
        if choice["type"] == "tool":
            assert [c.name for c in calls] == ["forecast"]
        for call in calls:
            if call.name == "forecast":
                assert isinstance(call.input["city"], str) and len(call.input["city"]) <= 12
                assert 1 <= call.input["days"] <= 7
        # `any` allows several calls: random weights may write calls until max_tokens.
        assert answer.stop_reason in (("tool_use",) if choice["type"] == "tool" else ("tool_use", "max_tokens"))


def test_x_api_key(keyed_server):
    good = anthropic.Anthropic(base_url=keyed_server.root, api_key="test-key-123", max_retries=0)
    assert good.messages.create(messages=HELLO, **GREEDY).type == "message"
    bad = anthropic.Anthropic(base_url=keyed_server.root, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        bad.messages.create(messages=HELLO, **GREEDY)


def test_thinking_reaches_the_template_switch(client):
    off = client.messages.count_tokens(model="m", messages=HELLO)
    on = client.messages.count_tokens(model="m", messages=HELLO, thinking={"type": "enabled", "budget_tokens": 1024})
    # Qwen3.6's prompt without thinking closes an empty <think></think> block; with it, opens one.
    assert on.input_tokens < off.input_tokens
