"""``GET /v1/limits``: the deployment's batch limits, read by ``llmq batch run`` to size its shards."""

from llmq_core.settings import Settings


async def test_limits_name_the_batch_caps_of_the_settings(make_app):
    client, *_ = await make_app(Settings(jobs={"batch_max_lines": 1000, "files_max_bytes": 5_000_000}))
    response = await client.get("/v1/limits")
    assert response.status_code == 200
    assert response.json() == {
        "object": "limits",
        "batch": {
            "max_requests": 1000,
            "max_file_bytes": 5_000_000,
            "max_line_bytes": Settings().jobs.batch_max_line_bytes,
            "max_completion_window_s": Settings().jobs.batch_max_window_s,
        },
        "message_batch": {
            "max_requests": 100_000,
            "max_body_bytes": 256 * 1024 * 1024,
            "max_request_bytes": Settings().jobs.batch_max_line_bytes,
            "expires_after_s": 86_400,
        },
    }


async def test_limits_need_an_api_key(setup):
    client, *_ = setup
    response = await client.get("/v1/limits", headers={"authorization": ""})
    assert response.status_code == 401 and response.json()["error"]["type"] == "invalid_request_error"
