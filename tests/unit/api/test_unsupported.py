"""What llmq does not serve (images, audio, embeddings: docs/api.md "Not supported") is a clear 404 or 400 in OpenAI's
shape, through the official SDK (issue 33 item 6)."""

import io

import openai
import pytest


@pytest.fixture
async def sdk(setup):
    client, *_ = setup
    return openai.AsyncOpenAI(base_url="http://api/v1", api_key="llmq-dev-key", max_retries=0, http_client=client)


def refused(info, status: int, code: str | None, param: str | None = None) -> str:
    error = info.value.body
    assert info.value.status_code == status and set(error) == {"message", "type", "param", "code"}, error
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", code, param), error
    return error["message"]


@pytest.mark.parametrize(
    "call,what",
    [
        (lambda c: c.embeddings.create(model="llmq-sim", input="hi"), "embeddings"),
        (lambda c: c.images.generate(model="llmq-sim", prompt="a cat"), "image"),
        (lambda c: c.audio.speech.create(model="llmq-sim", voice="alloy", input="hi"), "audio"),
        (
            lambda c: c.audio.transcriptions.create(model="llmq-sim", file=("a.wav", io.BytesIO(b"RIFF"))),
            "audio",
        ),
        (lambda c: c.moderations.create(input="hi"), "moderations"),
        (lambda c: c.responses.create(model="llmq-sim", input="hi"), "Responses API"),
    ],
)
async def test_routes_llmq_does_not_serve_are_a_404_naming_what(sdk, call, what):
    with pytest.raises(openai.NotFoundError) as info:
        await call(sdk)
    message = refused(info, 404, "unsupported_endpoint")
    assert what in message and "docs/api.md#not-supported" in message


async def test_any_other_unknown_route_is_openais_invalid_url(setup):
    client, *_ = setup
    response = await client.post("/v1/nothing-here", json={})
    assert response.status_code == 404 and response.json()["error"]["message"] == "Invalid URL (POST /v1/nothing-here)"


@pytest.mark.parametrize(
    "extra,param",
    [
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            "messages[0].content[0]",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}
                ]
            },
            "messages[0].content[0]",
        ),
        ({"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"}}, "audio"),
        ({"modalities": ["audio"]}, "modalities"),
    ],
)
async def test_image_and_audio_inputs_and_outputs_of_chat_are_a_400_naming_them(sdk, extra, param):
    body = {"model": "llmq-sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **extra}
    with pytest.raises(openai.BadRequestError) as info:
        await sdk.chat.completions.create(**body)
    error = info.value.body
    assert info.value.status_code == 400 and error["param"] == param, error
