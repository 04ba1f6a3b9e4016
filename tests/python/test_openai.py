"""The official openai Python client against a live `spindle serve` on the demo model.

The demo model has random weights: tests compare the server with itself (streamed against
whole answers, stopped against unstopped), never with an expected text.
"""

import base64
import json
import math
import struct
import urllib.request
import zlib

import openai
import pytest

GREEDY = {"temperature": 0, "max_tokens": 24}


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=60)


def test_models_lists_the_demo(client):
    ids = [m.id for m in client.models.list()]
    assert ids == ["spindle-demo"]


def test_chat_completion(client):
    r = client.chat.completions.create(
        model="whatever-the-client-asks",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}],
        **GREEDY,
    )
    assert r.object == "chat.completion"
    assert r.model == "spindle-demo"
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    assert 1 <= r.usage.completion_tokens <= 24
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_streaming_matches_whole_answer_and_reports_usage(client):
    messages = [{"role": "user", "content": "Tell me about the sea."}]
    whole = client.chat.completions.create(model="m", messages=messages, **GREEDY)
    stream = client.chat.completions.create(
        model="m", messages=messages, stream=True, stream_options={"include_usage": True}, **GREEDY
    )
    text, reasons, usage = "", [], None
    for chunk in stream:
        assert chunk.object == "chat.completion.chunk"
        if chunk.usage is not None:
            assert chunk.choices == []
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            if choice.finish_reason:
                reasons.append(choice.finish_reason)
    assert text == whole.choices[0].message.content
    assert reasons == [whole.choices[0].finish_reason]
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens


def test_template_kwargs_are_accepted(client):
    r = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        extra_body={"chat_template_kwargs": {"enable_thinking": False}, "top_k": 20, "min_p": 0.05},
        seed=7,
        **GREEDY,
    )
    assert r.choices[0].finish_reason in ("stop", "length")


def test_stop_strings(client):
    whole = client.completions.create(model="m", prompt="Once upon a time", max_tokens=30, temperature=0)
    text = whole.choices[0].text
    assert len(text) > 8, f"the demo model wrote too little to test stop: {text!r}"
    stop = text[5:7]
    stopped = client.completions.create(
        model="m", prompt="Once upon a time", max_tokens=30, temperature=0, stop=[stop]
    )
    assert stopped.choices[0].text == text[: text.index(stop)]
    assert stopped.choices[0].finish_reason == "stop"
    streamed = client.completions.create(
        model="m", prompt="Once upon a time", max_tokens=30, temperature=0, stop=stop, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == stopped.choices[0].text


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"temperature": -1}, "temperature"),
        ({"n": 99}, "n"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"max_tokens": -3}, "max_tokens"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ],
)
def test_bad_requests_raise_bad_request_error(client, extra, param):
    args = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **extra}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(**args)
    assert e.value.status_code == 400
    assert e.value.param == param
    assert e.value.type == "invalid_request_error"


def test_template_errors_are_bad_requests(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "a"}, {"role": "system", "content": "b"}],
            max_tokens=4,
        )
    assert "System message must be at the beginning" in str(e.value)


def test_api_key(keyed_server):
    bad = openai.OpenAI(base_url=keyed_server.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    good = openai.OpenAI(base_url=keyed_server.base_url, api_key="test-key-123", max_retries=0)
    r = good.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], **GREEDY)
    assert r.choices[0].message.role == "assistant"
    # /health needs no key.
    with urllib.request.urlopen(keyed_server.root + "/health", timeout=5) as h:
        assert json.load(h) == {"status": "ok"}


def test_metrics_count_requests(server, client):
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], **GREEDY)
    with urllib.request.urlopen(server.root + "/metrics", timeout=5) as r:
        text = r.read().decode()
    assert 'spindle_requests_total{endpoint="/v1/chat/completions",status="200"}' in text
    for name in [
        "spindle_prompt_tokens_total",
        "spindle_generated_tokens_total",
        "spindle_queue_depth",
        "spindle_active_sessions",
        "spindle_cancelled_generations_total",
        "spindle_decode_tokens_per_second",
        "spindle_expert_cache_hit_rate",
    ]:
        assert f"\n{name} " in text, name


def png(width, height):
    """An RGB PNG with a gradient, written with zlib alone (no imaging library)."""
    rows = b"".join(
        b"\x00" + bytes((x * 7 + y * 3 + c * 50) % 256 for x in range(width) for c in range(3))
        for y in range(height)
    )

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def image_tokens(height, width, factor=32, min_pixels=65536, max_pixels=16777216):
    """transformers' smart_resize (Python's round-half-to-even), then one token per 2x2 block of
    16-pixel patches: the demo has no preprocessor_config.json, so the released bounds apply."""
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return (h_bar // 16 // 2) * (w_bar // 16 // 2)


def post(server, path, body):
    request = urllib.request.Request(
        server.root + path, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as r:
        return json.load(r)


def image_chat(data):
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    return [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in the picture?"},
                {"type": "image_url", "image_url": {"url": url}},
            ],
        }
    ]


def test_a_base64_png_in_a_chat_is_answered(server, client):
    # 100x75 -> smart_resize 320x224 -> 20x14 patches -> 70 image tokens.
    width, height = 100, 75
    assert image_tokens(height, width) == 70
    messages = image_chat(png(width, height))
    r = client.chat.completions.create(model="m", messages=messages, **GREEDY)
    assert r.choices[0].message.content, r
    assert r.choices[0].finish_reason in ("stop", "length")
    # The chat template's text with one <|image_pad|> per image, which the server expands to the
    # image's grid: the template's tokens without the pad, plus the image's tokens.
    prompt = post(server, "/apply-template", {"messages": messages})["prompt"]
    assert prompt.count("<|vision_start|><|image_pad|><|vision_end|>") == 1, prompt
    text = post(server, "/tokenize", {"content": prompt.replace("<|image_pad|>", "")})["tokens"]
    assert r.usage.prompt_tokens == len(text) + image_tokens(height, width)


def test_a_broken_image_is_a_bad_request_naming_it(client):
    broken = png(100, 75)[:60]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=image_chat(broken), max_tokens=4)
    assert e.value.status_code == 400
    assert e.value.param == "messages[0].content[1].image_url.url"
    assert "could not be decoded" in str(e.value)
