"""Stage 1, capture: read messages of any framework, keep what memory needs, spot feedback signals."""

from memstore.capture.conversation import ConversationContext, capture_conversation
from memstore.capture.filtering import filter_messages_for_memory
from memstore.capture.signals import detect_correction, detect_reinforcement

__all__ = [
    "ConversationContext",
    "capture_conversation",
    "detect_correction",
    "detect_reinforcement",
    "filter_messages_for_memory",
]
