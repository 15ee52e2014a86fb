"""A batch line whose body fails validation carries, in the error file, the very error object the endpoint answers
for the same body: status, message, type, param and code."""

import json

import pytest

from llmq_api import validation
from llmq_api.auth import Principal
from llmq_api.batch_jobs import inputs
from llmq_api.batch_jobs.builder import _rejected
from llmq_api.errors import ApiError
from llmq_core.models import BUILTIN_MODELS
from llmq_jobs import lines
from tests.builders import job_spec

MODELS = {name: spec.context_window for name, spec in BUILTIN_MODELS.items()}
ENDPOINT = "/v1/completions"
SPEC = job_spec(endpoint=ENDPOINT, input_file_id="file-x", created_ms=1_000, expires_ms=2_000)
GOOD = {"model": "llmq-sim", "prompt": "hi", "max_tokens": 4}
BAD_BODIES = [
    {**GOOD, "temperature": 9},  # out of range
    {**GOOD, "n": 129},
    {**GOOD, "max_tokens": 10**30},  # an integer past int64
    {**GOOD, "max_tokens": "four"},  # wrong type
    {**GOOD, "model": "no-such-model"},  # unknown model: 404
    {"prompt": "hi"},  # missing model
    {**GOOD, "prompt": "x " * 9000, "max_tokens": 1},  # prompt over the context window
    {**GOOD, "stop": ["s"] * 5},  # too many stop sequences
    {**GOOD, "logit_bias": {"1" * 5000: 1}},  # huge logit_bias key
    {**GOOD, "best_of": 2},  # unsupported parameter
]


def endpoint_error(body: dict) -> ApiError:
    with pytest.raises(ApiError) as caught:
        validation.parse_completion(json.dumps(body).encode(), MODELS)
    return caught.value


@pytest.mark.parametrize("body", BAD_BODIES)
def test_the_error_line_has_the_endpoints_status_and_error_object(body):
    expected = endpoint_error(body)
    line = json.dumps({"custom_id": "c", "method": "POST", "url": ENDPOINT, "body": body})
    [checked] = inputs.check_input(line.encode(), ENDPOINT, MODELS, inputs.Limits(10, 1 << 20)).lines
    succeeded, out = lines.output_line(_rejected(SPEC, Principal(tenant_id="t"), checked))
    assert not succeeded
    assert out["response"]["status_code"] == expected.status
    assert out["response"]["body"] == expected.body()
    assert expected.param is not None or expected.code == "invalid_json"
