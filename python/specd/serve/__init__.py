"""An OpenAI-compatible HTTP server over one LLM (``specd serve``): ``make_app`` builds the
FastAPI app, ``AsyncLLM`` drives the LLM from an engine thread. Needs ``pip install
specd[serve]`` (FastAPI and uvicorn)."""

from specd.serve.async_llm import AsyncLLM, RequestStream
from specd.serve.in_thread import serving_in_thread

__all__ = ["AsyncLLM", "RequestStream", "make_app", "serving_in_thread"]


def make_app(engine: AsyncLLM, model_name: str, api_key=None):
    from specd.serve.app import make_app as _make_app

    return _make_app(engine, model_name, api_key)
