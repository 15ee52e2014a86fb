"""Edges of /v1/files and /v1/batches a new user hit with the OpenAI SDK (issue 33 item 5): each answered as OpenAI
answers it, or refused with a 400 naming the parameter. The app runs with the fake worker and stores into memory
(:class:`MemoryJobStore`, a ``memory://`` file store)."""

import json
import uuid

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
