"""A query parameter of the wrong type is a 400 OpenAI error naming it (FastAPI's own answer is a 422 ``detail`` list)."""

import pytest


@pytest.mark.parametrize("path,param", [("/v1/batches?limit=abc", "limit"), ("/v1/files?limit=1.5", "limit")])
async def test_wrong_typed_query_parameter_is_an_openai_400(setup, path, param):
    client, _, _, _ = setup
    response = await client.get(path)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["code"] == "invalid_type"
