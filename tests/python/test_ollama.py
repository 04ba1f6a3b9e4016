"""The ollama Python client against a live `spindle serve` on the demo model."""

import ollama
import pytest

OPTIONS = {"temperature": 0, "num_predict": 16}
HELLO = [{"role": "user", "content": "Hello!"}]


@pytest.fixture
def client(server):
    return ollama.Client(host=server.root, timeout=60)


def test_chat_whole_and_streamed_agree(client):
    whole = client.chat(model="spindle-demo", messages=HELLO, options=OPTIONS, think=False)
    assert whole.done and whole.done_reason in ("stop", "length")
    assert whole.message.role == "assistant"
    assert 1 <= whole.eval_count <= 16
    chunks = list(client.chat(model="spindle-demo", messages=HELLO, options=OPTIONS, think=False, stream=True))
    assert "".join(c.message.content or "" for c in chunks) == whole.message.content
    assert chunks[-1].done and chunks[-1].eval_count == whole.eval_count


def test_generate(client):
    whole = client.generate(model="spindle-demo", prompt="Once upon a time", raw=True, options=OPTIONS)
    assert whole.done and isinstance(whole.response, str)
    streamed = "".join(c.response for c in client.generate(
        model="spindle-demo", prompt="Once upon a time", raw=True, options=OPTIONS, stream=True))
    assert streamed == whole.response


def test_list_and_show(client):
    models = client.list().models
    assert [m.model for m in models] == ["spindle-demo"]
    assert models[0].size > 0
    assert "tools" in client.show("spindle-demo").capabilities


def test_format_schema_gives_valid_json_and_unknown_options_are_refused(client):
    from pydantic import BaseModel, ConfigDict, Field

    class Pet(BaseModel):
        # Closed (additionalProperties: false): random weights would otherwise add keys forever.
        model_config = ConfigDict(extra="forbid")
        name: str = Field(max_length=10)
        legs: int = Field(ge=0, le=8)
        kind: str = Field(pattern="^(cat|dog|bird)$")

    answer = client.chat(model="spindle-demo", messages=HELLO, format=Pet.model_json_schema(),
                         options={**OPTIONS, "num_predict": 96})
    pet = Pet.model_validate_json(answer.message.content)
    assert 0 <= pet.legs <= 8
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="spindle-demo", messages=HELLO, options={"mirostat": 2})
    assert e.value.status_code == 400 and "mirostat" in e.value.error


def test_tool_round_trip(client):
    def get_weather(city: str) -> str:
        """Weather in a city.

        Args:
          city: the city
        """
        return "21 C"

    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "21 C", "tool_name": "get_weather"},
    ]
    r = client.chat(model="spindle-demo", messages=messages, tools=[get_weather], options=OPTIONS)
    assert r.done
    for call in r.message.tool_calls or []:
        assert isinstance(call.function.arguments, dict)
