"""OpenAI-compatible ``/v1/files`` and ``/v1/batches`` of the API pod (batch jobs run as the ``deferred`` class), and
Anthropic's Message Batches (``/v1/messages/batches``: :mod:`~llmq_api.batch_jobs.message_routes`) on the same
job engine (:mod:`~llmq_api.batch_jobs.builder`).

``router`` is the FastAPI APIRouter of ``/v1/files`` and ``/v1/batches`` the app includes. Job state lives in Redis (:mod:`llmq_jobs.store`), files in
the fsspec store (:mod:`llmq_jobs.filestore`); the result-routers drive the jobs (:mod:`llmq_result_router.jobs`).
"""

from llmq_api.batch_jobs.routes import router

__all__ = ["router"]
