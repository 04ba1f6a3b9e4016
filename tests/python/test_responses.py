"""The openai client's Responses API against a live `spindle serve` on the demo model."""

import openai
import pytest


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=60)


ASK = {"model": "m", "instructions": "Be brief.", "max_output_tokens": 24, "temperature": 0}


def test_create_and_stream_agree(client):
    whole = client.responses.create(input="Tell me about the sea.", **ASK)
    assert whole.object == "response" and whole.status in ("completed", "incomplete")
    assert isinstance(whole.output_text, str)
    assert whole.usage.total_tokens == whole.usage.input_tokens + whole.usage.output_tokens
    text, last = "", None
    for event in client.responses.create(input="Tell me about the sea.", stream=True, **ASK):
        if event.type == "response.output_text.delta":
            text += event.delta
        last = event
    assert text == whole.output_text
    assert last.type in ("response.completed", "response.incomplete")
    assert last.response.usage.output_tokens == whole.usage.output_tokens


def test_function_call_output_round_trip(client):
    tools = [{"type": "function", "name": "get_weather", "description": "Weather in a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    items = [
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "21 C"},
    ]
    r = client.responses.create(input=items, tools=tools, reasoning={"effort": "low"}, **ASK)
    assert r.status in ("completed", "incomplete")
    for item in r.output:
        assert item.type in ("message", "reasoning", "function_call")


def test_stored_state_is_refused(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(input="hi", store=True, **ASK)
    assert "store" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(input="hi", previous_response_id="resp_123", **ASK)
    assert "previous_response_id" in str(e.value)


def test_stream_helper_accumulates_the_events(client):
    whole = client.responses.create(input="Tell me about the sea.", **ASK)
    text = ""
    with client.responses.stream(input="Tell me about the sea.", **ASK) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                text += event.delta
    assert text == whole.output_text
