"""Chat playground backend: streaming client, conversations, persistence, export (no Gradio)."""

from app.backend.chat.client import ChatRequest, ChatStream, SamplingParams
from app.backend.chat.conversations import ChatError, ChatService

__all__ = ["ChatError", "ChatRequest", "ChatService", "ChatStream", "SamplingParams"]
