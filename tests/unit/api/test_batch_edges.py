"""Edges of /v1/files and /v1/batches a new user hit with the OpenAI SDK (issue 33 item 5): each answered as OpenAI
answers it, or refused with a 400 naming the parameter. The app runs with the fake worker and stores into memory
(:class:`MemoryJobStore`, a ``memory://`` file store)."""

import json
import uuid

import openai
import pytest

from llmq_api import pod
from llmq_core.settings import Settings
from tests.unit.api.fakes import MemoryJobStore

LINE = {"method": "POST", "url": "/v1/completions", "body": {"model": "llmq-sim", "prompt": "hi", "max_tokens": 2}}


@pytest.fixture
async def app(make_app, monkeypatch):
    store = MemoryJobStore()
    monkeypatch.setattr(pod, "JobStore", lambda redis, log=None: store)
    client, *_ = await make_app(Settings(jobs={"files_url": f"memory://edges-{uuid.uuid4().hex}"}))
    return client


async def upload(app, lines: int = 1) -> str:
    content = "".join(json.dumps({"custom_id": f"c{i}", **LINE}) + "\n" for i in range(lines))
    response = await app.post("/v1/files", files={"file": ("in.jsonl", content.encode())}, data={"purpose": "batch"})
    assert response.status_code == 200, response.text
    return response.json()["id"]


@pytest.mark.parametrize("metadata", ["a string", {"key": 1}, ["a", "list"], {"key": None}])
async def test_metadata_of_the_wrong_type_is_a_400_naming_metadata(app, metadata):
    body = {"input_file_id": await upload(app), "endpoint": "/v1/completions", "metadata": metadata}
    response = await app.post("/v1/batches", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "metadata" and error["code"] == "invalid_type", error


async def test_files_list_order_is_asc_or_desc_and_anything_else_a_400(app):
    first, second = await upload(app), await upload(app)
    newest = (await app.get("/v1/files", params={"purpose": "batch"})).json()["data"]
    oldest = (await app.get("/v1/files", params={"purpose": "batch", "order": "asc"})).json()["data"]
    assert [f["id"] for f in newest] == [second, first] and [f["id"] for f in oldest] == [first, second]
    response = await app.get("/v1/files", params={"order": "sideways"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "order"


def sdk(app) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url="http://api/v1", api_key="llmq-dev-key", max_retries=0, http_client=app)


def refused(info, param: str) -> dict:
    error = info.value.body
    assert info.value.status_code == 400 and set(error) == {"message", "type", "param", "code"}, error
    assert (error["type"], error["param"]) == ("invalid_request_error", param), error
    return error


async def test_an_uploads_expires_after_is_honoured_within_openais_bounds(app):
    client = sdk(app)
    policy = {"anchor": "created_at", "seconds": 3600}
    kept = await client.files.create(file=("in.jsonl", b"{}\n"), purpose="batch", expires_after=policy)
    default = await client.files.create(file=("in.jsonl", b"{}\n"), purpose="batch")
    assert kept.expires_at == kept.created_at + 3600  # it was 30 days whatever was asked
    assert default.expires_at == default.created_at + 30 * 86_400
    assert (await client.files.retrieve(kept.id)).expires_at == kept.expires_at


@pytest.mark.parametrize(
    "policy,param,code",
    [
        ({"anchor": "created_at", "seconds": 10}, "expires_after.seconds", "invalid_value"),
        ({"anchor": "created_at", "seconds": 2_592_001}, "expires_after.seconds", "invalid_value"),
        ({"anchor": "created_at", "seconds": "soon"}, "expires_after.seconds", "invalid_value"),
        ({"anchor": "last_active_at", "seconds": 3600}, "expires_after.anchor", "invalid_value"),
        ({"seconds": 3600}, "expires_after.anchor", "missing_required_parameter"),
        ({"anchor": "created_at"}, "expires_after.seconds", "missing_required_parameter"),
    ],
)
async def test_an_expires_after_openai_refuses_is_a_400_naming_its_field(app, policy, param, code):
    with pytest.raises(openai.BadRequestError) as info:
        await sdk(app).files.create(file=("in.jsonl", b"{}\n"), purpose="batch", expires_after=policy)
    assert refused(info, param)["code"] == code


async def test_a_plain_expires_after_field_is_a_400(app):
    response = await app.post(
        "/v1/files",
        files={"file": ("in.jsonl", b"{}\n")},
        data={"purpose": "batch", "expires_after": '{"anchor": "created_at", "seconds": 3600}'},
    )
    assert response.status_code == 400 and response.json()["error"]["param"] == "expires_after"


async def test_a_batchs_output_expires_after_sets_its_output_files_expiry(make_app, monkeypatch):
    store = MemoryJobStore()
    monkeypatch.setattr(pod, "JobStore", lambda redis, log=None: store)
    settings = Settings(jobs={"files_url": f"memory://edges-{uuid.uuid4().hex}", "files_retention_s": 5000})
    app, *_ = await make_app(settings)
    client = sdk(app)
    for seconds, kept_s in ((3600, 3600), (7200, 5000)):  # at most the deployment's retention
        batch = await client.batches.create(
            input_file_id=await upload(app),
            endpoint="/v1/completions",
            completion_window="24h",
            output_expires_after={"anchor": "created_at", "seconds": seconds},
        )
        window_end = batch.created_at + 24 * 3600  # while it runs, the latest its files can be created
        for file_id in (batch.output_file_id, batch.error_file_id):
            assert store.files.records[file_id].expires_at == window_end + kept_s


@pytest.mark.parametrize(
    "policy,param",
    [
        ({"anchor": "created_at", "seconds": 3599}, "output_expires_after.seconds"),
        ({"anchor": "expires_at", "seconds": 3600}, "output_expires_after.anchor"),
        ({"anchor": "created_at", "seconds": "3600"}, "output_expires_after.seconds"),
        ({"anchor": "created_at"}, "output_expires_after.seconds"),
        ("an hour", "output_expires_after"),
    ],
)
async def test_an_output_expires_after_openai_refuses_is_a_400_naming_its_field(app, policy, param):
    body = {"input_file_id": await upload(app), "endpoint": "/v1/completions", "output_expires_after": policy}
    response = await app.post("/v1/batches", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param, response.json()
