"""Chat playground backend: streaming client, conversations, persistence, export (no Gradio)."""

from app.backend.chat.client import ChatClient, ChatRequest, SamplingParams
from app.backend.chat.service import ChatError, ChatService

__all__ = ["ChatClient", "ChatError", "ChatRequest", "ChatService", "SamplingParams"]
