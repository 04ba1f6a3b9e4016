"""Structured outputs, forced tool calls, logprobs and n through the official clients
(openai, langchain-openai) against a live `spindle serve` on the demo model.

The demo model has random weights: left to itself it never writes JSON, so every parsed object
below exists only because the grammar held it to the schema. String fields carry a max_length:
on random weights an unbounded string need not end.
"""

import json
from enum import Enum
from typing import List

import openai
import pytest
from pydantic import BaseModel, Field

GREEDY = {"temperature": 0, "max_tokens": 200}


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)


class Color(str, Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Address(BaseModel):
    city: str = Field(max_length=10)
    zip_code: int = Field(ge=10000, le=99999)


class Person(BaseModel):
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=120)
    favorite: Color
    address: Address


class Flags(BaseModel):
    ok: bool
    level: int = Field(ge=1, le=3)



def test_unconstrained_text_is_not_json(client):
    r = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Answer in JSON."}], **GREEDY
    )
    with pytest.raises(ValueError):
        json.loads(r.choices[0].message.content)


@pytest.mark.parametrize("schema", [Person, Flags])
def test_parse_returns_the_pydantic_object(client, schema):
    r = client.chat.completions.parse(
        model="m",
        messages=[{"role": "user", "content": f"Give me a {schema.__name__}."}],
        response_format=schema,
        **GREEDY,
    )
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, schema)
    assert r.choices[0].finish_reason == "stop"


def test_parse_with_arrays_and_ranges(client):
    class Bounded(BaseModel):
        tags: List[Color] = Field(max_length=3)
        scores: List[int] = Field(max_length=3)
        ratio: float = Field(ge=0.5, le=99.5)

    r = client.chat.completions.parse(
        model="m",
        messages=[{"role": "user", "content": "Tags and scores."}],
        response_format=Bounded,
        **GREEDY,
    )
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, Bounded)
    assert len(parsed.tags) <= 3 and 0.5 <= parsed.ratio <= 99.5


def test_json_object_and_bad_schema(client):
    r = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "JSON"}],
        # strict: no properties beyond the schema's (without it JSON Schema allows any more,
        # and a random model writes keys forever).
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "f", "schema": Flags.model_json_schema(), "strict": True},
        },
        **GREEDY,
    )
    assert Flags.model_validate_json(r.choices[0].message.content)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "JSON"}],
            response_format={"type": "json_schema", "json_schema": {"name": "f", "schema": {"type": "blob"}}},
            max_tokens=4,
        )
    assert e.value.param == "response_format"


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "days": {"type": "integer", "minimum": 1, "maximum": 5},
            },
            "required": ["city", "days"],
        },
    },
}


def test_named_tool_choice_always_calls_that_tool(client):
    for content in ["Weather?", "Tell me a joke.", "Hi"]:
        r = client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": content}],
            tools=[WEATHER],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            **GREEDY,
        )
        calls = r.choices[0].message.tool_calls
        assert r.choices[0].finish_reason == "tool_calls"
        assert len(calls) == 1 and calls[0].function.name == "get_weather"
        args = json.loads(calls[0].function.arguments)
        assert isinstance(args["city"], str) and len(args["city"]) <= 12
        assert 1 <= args["days"] <= 5


def test_logprobs_and_n(client):
    r = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Hello"}],
        logprobs=True,
        top_logprobs=4,
        temperature=0,
        max_tokens=5,
        # Logprobs are of the raw logits: without the demo's repetition penalty greedy picks
        # the most likely of them.
        extra_body={"repetition_penalty": 1},
    )
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 5
    assert all(len(t.top_logprobs) == 4 and t.logprob <= 0 for t in content)
    assert all(t.top_logprobs[0].token == t.token for t in content)

    many = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Hi"}], n=3, seed=11, temperature=1, max_tokens=8
    )
    assert [c.index for c in many.choices] == [0, 1, 2]
    for i, choice in enumerate(many.choices):
        one = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Hi"}], seed=11 + i, temperature=1, max_tokens=8
        )
        assert choice.message.content == one.choices[0].message.content

    text = client.completions.create(model="m", prompt="The sky is", max_tokens=3, logprobs=2, echo=True)
    lp = text.choices[0].logprobs
    assert text.choices[0].text.startswith("The sky is")
    assert lp.token_logprobs[0] is None and len(lp.tokens) == len(lp.token_logprobs)


def test_unsupported_fields_are_refused_by_name(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hi"}],
            functions=[{"name": "f", "parameters": {"type": "object"}}],
            max_tokens=4,
        )
    assert e.value.param == "functions"


def test_langchain_structured_output_and_bind_tools(server):
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=server.base_url, api_key="unused", model="m", temperature=0, max_tokens=200)
    structured = llm.with_structured_output(Person, method="json_schema")
    person = structured.invoke("Make up a person.")
    assert isinstance(person, Person)

    class TimeArgs(BaseModel):
        zone: str = Field(max_length=6)

    @tool(args_schema=TimeArgs)
    def get_time(zone: str) -> str:
        """The time in a time zone."""
        return "noon"

    bound = llm.bind_tools([get_time], tool_choice="get_time")
    message = bound.invoke("What time is it in UTC?")
    assert len(message.tool_calls) >= 1
    assert message.tool_calls[0]["name"] == "get_time"
    assert isinstance(message.tool_calls[0]["args"]["zone"], str)
